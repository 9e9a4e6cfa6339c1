"""Reference cases of notebooks 04-08 (the captioning Transformer: data, model, training, generation and
evaluation, decoding), made together: `cases_of("06", ns)` gives one notebook's share (grading/cases/registry.py
lists it as notebook 06's case maker), and every case keeps the inputs its generator gives it in one sequence,
the order of `all_cases` here. Each topic has its module, with its known bugs, case rows and case makers:

    data.py       04: extract_grid_features, build_vocab, encode_captions, the Dataset, collate
    model.py      05: CaptioningTransformer.forward, caption_loss, teacher_forcing_loss
    training.py   05: the optimiser; 06: the schedule, the step, the validation loss, fit, the training script;
                  07: the evaluation script, and the trained model handed in (`python -m grading.cases.captioning`
                  prints its shares)
    decoding.py   07: greedy_decode; 08: beam_search and its worked example, sample_decode
    common.py     the toy model, random captions, the variants' wrapper

The model cases always build the model with ``layers="torch"`` (PyTorch-backed layers from
``starter.layers``), so they never depend on notebooks 02-03. The decoding and teacher-forcing cases
run the student's function on ``starter.layers.ToyCaptioner`` (a small causal stand-in model) through
``starter.layers.with_model``, so they don't depend on the student's model either. Variants are known
bugs written here independently of the solution; variants that coincide with the correct output on a
case are dropped for that case.
"""
from __future__ import annotations

import torch

from grading import notebooks
from grading.cases.captioning.common import _captions, _text_captions, solutions_namespace
from grading.cases.captioning.data import (
    CollateCase,
    DatasetCase,
    EncodeCase,
    VocabCase,
    _collate_spec,
    _dataset_spec,
    _encode_spec,
    _vocab_spec,
    feature_cases,
)
from grading.cases.captioning.decoding import (
    BeamCase,
    GreedyCase,
    SampleCase,
    _beam_spec,
    _greedy_spec,
    _sample_spec,
    _worked_beam_spec,
)
from grading.cases.captioning.model import LossCase, ModelCase, TeacherCase, _loss_spec, _model_spec, _teacher_spec
from grading.cases.captioning.training import (
    EvaluateCase,
    OptimizerCase,
    ScheduleCase,
    StepCase,
    _evaluate_spec,
    _optimizer_spec,
    _schedule_spec,
    _step_spec,
    eval_script_cases,
    fit_cases,
    train_script_cases,
    trained_cases,
    validation_cases,
)
from grading.references import CaseSpec, randn
from starter.layers import with_attention, with_model, with_sampler
from starter.pipeline import (
    over_steps,
    with_batches,
    with_cnn,
    with_h5_file,
    with_items,
    with_loader,
    with_long_output,
    with_optimizer,
    with_param_groups,
    with_probe_words,
    with_split,
)
from starter.scripts import with_eval_script, with_train_script

# which notebook a case belongs to, by the task its name starts with
PREFIXES = {"04": ("features/", "vocab/", "encode/", "dataset/", "collate/"),
            "05": ("captioner/", "loss/", "teacher/", "optimizer/"),
            "06": ("schedule/", "step/", "validation/", "fit/", "train_script/"),
            "07": ("greedy/", "evaluate/", "eval_script/", "trained/"),
            "08": ("beam/", "sample/")}


_made: dict = {}  # the cases of 04-08 and the namespace they were made in, made once per process


def cases_of(number: str, ns: dict) -> list[CaseSpec]:
    """The cases of notebook `number` ("04" to "08"); `ns`, its solution's namespace, gets the names of the
    others and the adapters the test cells show. The three notebooks' cases are made together, once per
    process (choosing the decoding cases' seeds takes minutes): a second notebook's `ns` gets the names the
    first one's got."""
    if not _made:
        made_in = solutions_namespace(ns)
        _made.update(specs=all_cases(made_in), ns=made_in)
    for name, value in _made["ns"].items():
        ns.setdefault(name, value)
    specs = _made["specs"]
    unplaced = [s.name for s in specs if not s.name.startswith(sum(PREFIXES.values(), ()))]
    if unplaced:
        raise ValueError(f"cases of no notebook (add their prefix to PREFIXES): {unplaced}")
    return [s for s in specs if s.name.startswith(PREFIXES[number])]


def all_cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(2027)
    # the adapters the test cells wrap the answers in, under the names the messages show
    ns["with_attention(CaptioningTransformer)"] = with_attention(ns["CaptioningTransformer"])
    for fn in ("teacher_forcing_loss", "greedy_decode", "beam_search"):
        ns[f"with_model({fn})"] = with_model(ns[fn])
    ns["with_sampler(sample_decode)"] = with_sampler(ns["sample_decode"])
    out = []

    # CaptioningTransformer(...).forward(features, captions)
    out += [_model_spec(c, g) for c in [
        ModelCase(name="captioner/basic", batch=2, length=6, regions=9, feature_dim=12, vocab=15, d_model=16, heads=2,
                  layers=2, dim_feedforward=32, public=True),
        ModelCase(name="captioner/square", batch=3, length=5, regions=4, feature_dim=16, vocab=11, d_model=16, heads=4,
                  layers=2, dim_feedforward=24),
        ModelCase(name="captioner/one_region", batch=2, length=7, regions=1, feature_dim=10, vocab=13, d_model=8,
                  heads=2, layers=1, dim_feedforward=16),
        ModelCase(name="captioner/three_layers_float64", batch=2, length=5, regions=6, feature_dim=8, vocab=9,
                  d_model=12, heads=3, layers=3, dim_feedforward=20, dtype=torch.float64),
        ModelCase(name="captioner/grad", batch=2, length=4, regions=5, feature_dim=6, vocab=10, d_model=8, heads=2,
                  layers=2, dim_feedforward=16, grad=True),
        ModelCase(name="captioner/attention", batch=2, length=5, regions=9, feature_dim=12, vocab=15, d_model=16,
                  heads=2, layers=2, dim_feedforward=32, attention=True, public=True),
        ModelCase(name="captioner/attention_one_layer", batch=1, length=6, regions=4, feature_dim=8, vocab=10,
                  d_model=8, heads=4, layers=1, dim_feedforward=16, attention=True),
    ]]

    # caption_loss(logits, targets, null_idx)
    out += [_loss_spec(c, g) for c in [
        LossCase(name="loss/basic", lengths=[5, 3, 1], length=7, vocab=9, public=True),
        LossCase(name="loss/other_null_idx", lengths=[4, 2], length=6, vocab=8, null_idx=5),
        LossCase(name="loss/uneven_lengths", lengths=[8, 1, 2, 5], length=10, vocab=12),
        LossCase(name="loss/no_padding_float64", lengths=[6, 6], length=6, vocab=7, dtype=torch.float64),
        LossCase(name="loss/large_vocab", lengths=[3, 5, 2], length=6, vocab=40),
        LossCase(name="loss/grad", lengths=[4, 7, 2], length=7, vocab=10, grad=True),  # no padding leaks in
    ]]

    # teacher_forcing_loss(model, features, captions, null_idx) on the toy model
    out += [_teacher_spec(c, g) for c in [
        TeacherCase(name="teacher/basic", lengths=[4, 2, 6], length=9, regions=3, feature_dim=5, vocab=10, public=True),
        TeacherCase(name="teacher/other_null_idx", lengths=[3, 5], length=8, regions=2, feature_dim=4, vocab=9,
                    null_idx=7),
        TeacherCase(name="teacher/long_captions", lengths=[2, 9], length=12, regions=3, feature_dim=4, vocab=8),
        # a full-length caption: its last word counts
        TeacherCase(name="teacher/grad", lengths=[3, 10, 5], length=12, regions=3, feature_dim=4, vocab=9, grad=True),
    ]]

    # greedy_decode(model, features, max_len, start_idx, end_idx, null_idx) on the toy model
    out += [_greedy_spec(c, g, ns) for c in [
        GreedyCase(name="greedy/basic", batch=4, regions=3, feature_dim=5, vocab=8, max_len=7, public=True),
        GreedyCase(name="greedy/one_image", batch=1, regions=2, feature_dim=4, vocab=9, max_len=6, want="ends"),
        GreedyCase(name="greedy/all_end_early", batch=3, regions=3, feature_dim=4, vocab=6, max_len=12,
                   want="all_early"),
        GreedyCase(name="greedy/other_special_tokens", batch=3, regions=2, feature_dim=6, vocab=9, max_len=8,
                   start_idx=4, end_idx=7, null_idx=5, told_apart=("start_ignored",)),
        GreedyCase(name="greedy/float64", batch=3, regions=4, feature_dim=5, vocab=7, max_len=6, dtype=torch.float64),
    ]]

    # beam_search(model, features, beam_width, max_len, ..., length_penalty) on the toy model
    out += [_beam_spec(c, g, ns) for c in [
        BeamCase(name="beam/basic", batch=2, regions=3, feature_dim=5, vocab=7, beam_width=3, max_len=6, public=True),
        BeamCase(name="beam/width_one_is_greedy", batch=3, regions=2, feature_dim=4, vocab=7, beam_width=1, max_len=6),
        BeamCase(name="beam/raw_scores", batch=2, regions=3, feature_dim=4, vocab=6, beam_width=3, max_len=7,
                 length_penalty=0.0),
        BeamCase(name="beam/batch_wide", batch=3, regions=3, feature_dim=5, vocab=8, beam_width=5, max_len=6,
                 length_penalty=1.0),
        BeamCase(name="beam/other_special_tokens", batch=2, regions=2, feature_dim=4, vocab=8, beam_width=2,
                 max_len=6, start_idx=4, end_idx=6, null_idx=5, want=("start_ignored",)),
    ]]
    # cases that separate the width rules and the length conventions, from their own generator so
    # that the cases above keep their inputs: the beam narrows as hypotheses finish (not k live at every step),
    # all hypotheses x words are ranked together (not each hypothesis' own best word), L counts <END>
    g_rules = torch.Generator().manual_seed(1414)
    out += [_beam_spec(c, g_rules, ns) for c in [
        BeamCase(name="beam/narrowing_beam", batch=3, regions=2, feature_dim=4, vocab=8, beam_width=4, max_len=6,
                 length_penalty=1.0, want=("keep_k_live", "per_hypothesis_best", "no_narrowing")),
        BeamCase(name="beam/end_in_length", batch=3, regions=3, feature_dim=5, vocab=8, beam_width=3, max_len=7,
                 want=("length_without_end", "per_hypothesis_best")),
    ]]
    out += [_worked_beam_spec(ns)]

    # sample_decode(model, features, max_len, temperature, generator, ...) on the toy model; a generator of its own,
    # so that the cases above keep their inputs
    g_sample = torch.Generator().manual_seed(2031)
    TEMPERATURE_BUGS = ("no_temperature", "temperature_multiplied")  # away from temperature 1, each its own captions
    out += [_sample_spec(c, g_sample, ns) for c in [
        SampleCase(name="sample/basic", batch=4, regions=3, feature_dim=5, vocab=7, max_len=6, temperature=0.7, seed=0,
                   want=TEMPERATURE_BUGS, public=True),
        SampleCase(name="sample/low_temperature", batch=4, regions=2, feature_dim=4, vocab=8, max_len=6,
                   temperature=0.3, seed=1, want=TEMPERATURE_BUGS),
        SampleCase(name="sample/high_temperature", batch=4, regions=3, feature_dim=4, vocab=7, max_len=7,
                   temperature=2.0, seed=2, want=TEMPERATURE_BUGS),
        SampleCase(name="sample/batch_wide", batch=9, regions=2, feature_dim=5, vocab=8, max_len=6, seed=3),
        SampleCase(name="sample/other_special_tokens", batch=4, regions=2, feature_dim=4, vocab=9, max_len=6,
                   start_idx=4, end_idx=6, null_idx=3, seed=4),
    ]]
    # every layer's attention, hidden (the public case has two layers too), from its own generator
    g_layers = torch.Generator().manual_seed(3031)
    out += [_model_spec(ModelCase(name="captioner/attention_three_layers", batch=2, length=4, regions=6,
                                  feature_dim=8, vocab=11, d_model=12, heads=3, layers=3, dim_feedforward=16,
                                  attention=True), g_layers)]
    # the pipeline tasks' adapters (starter.pipeline), under the names their test cells show
    for fn, adapter in PIPELINE_ADAPTERS.items():
        ns[f"{adapter.__name__}({fn})"] = adapter(ns[fn])
    scripts = {**notebooks.solution_scripts("06_training"),  # the scripts' cells, each file a module
               **notebooks.solution_scripts("07_generation_and_evaluation")}
    ns["with_train_script(train_script)"] = with_train_script(scripts["train_captioner.py"])
    ns["with_eval_script(eval_script)"] = with_eval_script(scripts["evaluate_captioner.py"])
    return (out + feature_cases(ns) + pipeline_cases(ns) + validation_cases(ns) + fit_cases(ns) + trained_cases()
            + train_script_cases(ns) + eval_script_cases(ns))
PIPELINE_ADAPTERS = {"extract_grid_features": with_cnn, "build_vocab": with_probe_words,
                     "encode_captions": with_long_output, "CaptionFeatures": with_h5_file,
                     "collate_captions": with_items, "lr_at_step": over_steps, "make_optimizer": with_param_groups,
                     "train_step": with_optimizer,
                     "validation_loss": with_batches, "fit": with_loader, "evaluate_captions": with_split}


def pipeline_cases(ns) -> list[CaseSpec]:
    g = torch.Generator().manual_seed(2117)
    out = []
    pool = ["a", "red", "blue", "circle", "square", "left", "right", "of", "the", "small", "big", "above", "there",
            "is", "green", "triangle"]

    # build_vocab(captions, min_count) -> where each probe word landed
    out += [_vocab_spec(c) for c in [
        VocabCase(name="vocab/basic", captions=_text_captions(g, 12, pool[:10]), public=True),
        VocabCase(name="vocab/min_count", captions=_text_captions(g, 20, pool), min_count=3),
        VocabCase(name="vocab/punctuation_and_case", captions=["A red circle, left.", "The RED square; right!",
                                                               "a dog's ball (red)", "Red-ish circle... left",
                                                               "red circle 2 left"]),
        VocabCase(name="vocab/ties", captions=["d c", "c d", "b a", "a b", "e", "a"]),  # ties first seen d, c, b
        VocabCase(name="vocab/single_caption", captions=["One small step"], min_count=2),
    ]]

    # encode_captions(captions, word_to_idx, max_len)
    out += [_encode_spec(c) for c in [
        EncodeCase(name="encode/basic", captions=["a red circle", "The blue square, left.", "a circle"], max_len=7,
                   public=True),
        EncodeCase(name="encode/unknown_words", captions=["a purple circle", "zebra",
                                                          "the red hexagon left of a square"], max_len=10),
        EncodeCase(name="encode/too_long", captions=["a red circle left of the blue square",
                                                     "a red circle left of a square", "a"], max_len=6),
        EncodeCase(name="encode/punctuation_and_case", captions=["A RED circle!", "(left) of: the square",
                                                                 "red,blue;circle"], max_len=8),
        EncodeCase(name="encode/exact_fit", captions=["a red circle left", "a red circle left of"], max_len=6),
    ]]

    # CaptionFeatures(path, key, captions, image_idxs)[i] for every i
    out += [_dataset_spec(c, g) for c in [
        DatasetCase(name="dataset/basic", images=3, regions=4, feature_dim=5, lengths=[2, 4, 1, 3], length=8,
                    public=True),
        DatasetCase(name="dataset/shared_images", images=2, regions=3, feature_dim=4, lengths=[3, 1, 2, 5, 2],
                    length=8),
        DatasetCase(name="dataset/full_length", images=3, regions=2, feature_dim=3, lengths=[6, 1, 4], length=8),
        DatasetCase(name="dataset/one_region", images=4, regions=1, feature_dim=6, lengths=[2, 3, 2], length=6),
    ]]
    caps = _captions([2, 3, 1], 6, 12, g)
    caps[1] = 0  # an empty caption: no <START>, no <END>
    out.append(CaseSpec(
        name="dataset/caption_without_end", target="with_h5_file(CaptionFeatures)",
        args=["features", "captions", "image_idxs"],
        inputs={"features": randn(2, 3, 4, g=g).half().float(), "captions": caps,
                "image_idxs": torch.tensor([1, 0, 1])},
        outputs=["item_features", "item_captions", "item_lengths"], public=False,
        properties=[["raises", "ValueError", "naming the row when a caption (row 1, all <NULL>) has no <END>"]]))

    # collate_captions(batch, null_idx)
    out += [_collate_spec(c, g) for c in [
        CollateCase(name="collate/basic", lengths=[3, 1, 5], regions=4, feature_dim=3, public=True),
        CollateCase(name="collate/other_null_idx", lengths=[2, 6, 4], regions=2, feature_dim=3, null_idx=7),
        CollateCase(name="collate/equal_lengths", lengths=[3, 3], regions=3, feature_dim=2),
        CollateCase(name="collate/one_item", lengths=[4], regions=2, feature_dim=2),
    ]]

    # lr_at_step(step, total_steps, warmup_steps, peak_lr) at many steps
    out += [_schedule_spec(c) for c in [
        ScheduleCase(name="schedule/basic", steps=list(range(0, 100, 3)) + [99], total_steps=100, warmup_steps=10,
                     peak_lr=1e-3, public=True),
        ScheduleCase(name="schedule/long_warmup", steps=list(range(0, 60, 2)), total_steps=60, warmup_steps=40,
                     peak_lr=5e-4),
        ScheduleCase(name="schedule/fractional_steps", steps=[0.5, 4.25, 9.5, 9.99, 10.5, 33.3, 71.7], total_steps=80,
                     warmup_steps=10, peak_lr=2e-3),
        ScheduleCase(name="schedule/past_the_end", steps=[0, 5, 49, 50, 60, 75, 120], total_steps=50, warmup_steps=5,
                     peak_lr=3e-3),
        ScheduleCase(name="schedule/no_warmup", steps=[0, 1, 2, 10, 20, 29, 30], total_steps=30, warmup_steps=0,
                     peak_lr=1e-2),
    ]]

    # train_step(...) a few times on the toy model
    out += [_step_spec(c, g) for c in [
        StepCase(name="step/adamw", optimizer="adamw", lrs=[0.01, 0.02, 0.005], grad_clip=0.5, lengths=[3, 5],
                 public=True),
        StepCase(name="step/sgd", optimizer="sgd", lrs=[0.5, 0.3], grad_clip=1.0, lengths=[4, 2, 3]),
        StepCase(name="step/sgd_clipped", optimizer="sgd", lrs=[0.2, 0.2, 0.2], grad_clip=0.05, lengths=[2, 5]),
        StepCase(name="step/no_clipping", optimizer="sgd", lrs=[0.3, 0.1], grad_clip=None, lengths=[3, 3]),
        StepCase(name="step/adamw_changing_lr", optimizer="adamw", lrs=[0.001, 0.05, 0.02], grad_clip=2.0,
                 lengths=[5, 1, 2]),
    ]]

    # evaluate_captions(model, decode_fn, split, vocab, max_len, batch_size) on stored tokens and references
    out += [_evaluate_spec(c, g) for c in [
        EvaluateCase(name="evaluate/basic", images=6, references=3, batch_size=4, public=True),
        EvaluateCase(name="evaluate/uneven_batches", images=7, references=2, batch_size=3),
        EvaluateCase(name="evaluate/many_references", images=5, references=5, batch_size=5),
        EvaluateCase(name="evaluate/words_after_end", images=6, references=3, batch_size=2, words_after_end=True),
        EvaluateCase(name="evaluate/one_batch", images=4, references=2, batch_size=10),
    ]]
    # the parts of the spec the cases above do not reach (from their own generator, so that the cases above keep
    # their inputs): an optimizer with two parameter groups, <UNK> in a generated caption
    g_spec = torch.Generator().manual_seed(3030)
    out += [_step_spec(StepCase(name="step/two_param_groups", optimizer="sgd_two_groups", lrs=[0.4, 0.1],
                                grad_clip=1.0, lengths=[2, 4, 3]), g_spec)]
    out += [_evaluate_spec(EvaluateCase(name="evaluate/unknown_words", images=6, references=2, batch_size=4,
                                        unknown_words=True), g_spec)]

    # make_optimizer(model, lr, weight_decay): the groups, and the weights after a few steps (no random inputs:
    # the weights come from the case's seed, the gradients from the adapter's)
    out += [_optimizer_spec(c) for c in [
        OptimizerCase(name="optimizer/basic", lr=0.01, weight_decay=0.1, public=True),
        OptimizerCase(name="optimizer/strong_decay", lr=0.05, weight_decay=0.5, steps=4),
        OptimizerCase(name="optimizer/no_decay", lr=0.002, weight_decay=0.0, steps=2),
        OptimizerCase(name="optimizer/wider", lr=0.02, weight_decay=0.01, vocab=11, hidden=6),
    ]]
    return out
