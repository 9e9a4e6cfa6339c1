"""The scripts of notebooks 06 and 07, train_captioner.py and evaluate_captioner.py: what the kit gives them (starter/scripts.py),
the solution's scripts run as a student runs them (a command line, on shapes), and the checks that grade them."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grading import notebooks
from grading.cases.captioning.training import (
    EVAL_SCRIPT_BUGS,
    TRAIN_SCRIPT_BUGS,
    _eval_script_bug,
    _train_script_bug,
)
from starter.checks import CheckFailed, check, load_case
from starter.scripts import EpochBatches, load_script, read_checkpoint, read_log, with_eval_script, with_train_script
from starter.training import TrainingPlan

ROOT = Path(__file__).resolve().parent.parent
TRAINING_STEM, EVALUATION_STEM = "06_training", "07_generation_and_evaluation"  # the notebooks that write the scripts


def _scripts():
    return {**notebooks.solution_scripts(TRAINING_STEM), **notebooks.solution_scripts(EVALUATION_STEM)}


# ---- what the kit gives the scripts ---------------------------------------------------------------------


def _as_fit_draws(batches: EpochBatches, steps: int) -> list[list[int]]:
    """The rows of `steps` batches, drawn as fit draws them (a new iter() when an epoch ends)."""
    out, it = [], iter(batches)
    while len(out) < steps:
        try:
            out.append(next(it).tolist())
        except StopIteration:
            it = iter(batches)
    return out


@pytest.mark.parametrize("stop_at", [1, 3, 4, 7])
def test_batches_from_any_step_are_those_of_a_run_that_never_stopped(stop_at):
    def fetch(rows):
        return rows

    whole = _as_fit_draws(EpochBatches(10, 3, seed=5, fetch=fetch), 12)
    first = _as_fit_draws(EpochBatches(10, 3, seed=5, fetch=fetch), stop_at)
    rest = _as_fit_draws(EpochBatches(10, 3, seed=5, fetch=fetch, start=stop_at), 12 - stop_at)
    assert first + rest == whole
    assert whole[0] != whole[3], "each epoch draws its own order"
    assert _as_fit_draws(EpochBatches(10, 3, seed=6, fetch=fetch), 3) != whole[:3], "the seed decides the order"


def test_a_plan_of_part_of_a_run_has_the_whole_runs_rates():
    def rate(step, total, warmup, peak):
        return peak * (step + 1) / total

    whole = list(TrainingPlan(10, rate, 2, 1.0, progress=False))
    part = list(TrainingPlan(10, rate, 2, 1.0, start=4, stop=7, progress=False))
    assert part == whole[4:7]
    with pytest.raises(ValueError, match="not within"):
        TrainingPlan(10, rate, 2, 1.0, start=8, stop=5, progress=False)
    with pytest.raises(ValueError, match="whole run"):
        TrainingPlan(10, rate, 2, 1.0, start=2, time_limit=5.0, progress=False)


def test_load_script_says_in_one_line_why_a_script_is_not_there(tmp_path, capsys):
    assert load_script(tmp_path / "nope.py") is None
    assert "does not exist yet" in capsys.readouterr().out
    script = tmp_path / "s.py"
    script.write_text("def fit():\n    return 1\n\nraise NotImplementedError()\n")
    assert load_script(script, "fit")() == 1, "a part written before an unfinished one is there"
    assert load_script(script) is None and "not finished yet" in capsys.readouterr().out
    script.write_text("def main(:\n")
    assert load_script(script, "main") is None and "SyntaxError" in capsys.readouterr().out


def test_a_damaged_checkpoint_is_one_clear_error_and_stays_as_it_was(tmp_path):
    from starter.scripts import CheckpointError
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        read_checkpoint(bad)
    assert bad.read_bytes() == b"\x00garbage" * 10
    torch.save({"weights": 1}, bad)
    with pytest.raises(CheckpointError, match="not a checkpoint of save_checkpoint"):
        read_checkpoint(bad)


# ---- the solution's scripts, run as a student runs them -----------------------------------------------------


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course folder with the solution's two scripts, the finished notebooks beside it (the scripts load
    the student's pieces from them), and a run of 6 steps in one go and one stopped at its checkpoint of step 4
    (--stop-at 3) and resumed."""
    folder = tmp_path_factory.mktemp("course")
    for stem in (TRAINING_STEM, EVALUATION_STEM):
        for name, source in notebooks.written_files(notebooks.read(notebooks.SOLUTIONS / f"{stem}.ipynb")).items():
            (folder / name).write_text(notebooks.strip_solution_markers(source), encoding="utf-8")
    small = ["--steps", "6", "--warmup", "1", "--save-every", "2", "--batch-size", "8", "--d-model", "16",
             "--heads", "2", "--layers", "1", "--dropout", "0.2", "--device", "cpu"]
    runs = {"one_go": [small], "resumed": [[*small, "--stop-at", "3"], [*small, "--resume"]]}
    results = {}
    for name, commands in runs.items():
        for command in commands:
            results[name] = _run(folder, "train_captioner.py", *command, "--checkpoint", f"runs/{name}.pt")
            assert results[name].returncode == 0, results[name].stderr[-2000:]
    return folder, results


def _run(folder, *args):
    env = dict(os.environ, COURSE_NOTEBOOKS_DIR=str(notebooks.SOLUTIONS), PYTHONPATH=str(ROOT))
    env.pop("NBGRADER_EXECUTION", None)
    return subprocess.run([sys.executable, *map(str, args)], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_resumed_run_ends_exactly_where_one_that_never_stopped_does(course):
    folder, results = course
    one_go, resumed = (read_checkpoint(folder / "runs" / f"{n}.pt") for n in ("one_go", "resumed"))
    for key, value in one_go["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][key]), key
    assert one_go["extra"]["step"] == resumed["extra"]["step"] == 6
    assert torch.equal(one_go["extra"]["rng"], resumed["extra"]["rng"])
    for p, state in one_go["extra"]["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(resumed["extra"]["optimizer"]["state"][p][name]))
    logs = [read_log(folder / "runs" / f"{n}.csv") for n in ("one_go", "resumed")]
    assert logs[0] == logs[1] and logs[0]["step"] == [1, 2, 3, 4, 5, 6] and logs[0]["val_step"] == [2, 4, 6]
    assert "step 6/6" in results["resumed"].stdout and "step 4/6" not in results["resumed"].stdout


def test_the_trained_model_mark_measures_the_scripts_checkpoint(course):
    """The grader measures the checkpoint the script wrote (optimiser state, random state and all): 6 steps
    caption nothing right, and the measurement says so rather than failing to load it."""
    from grading.trained_model import measure
    folder, _ = course
    case = load_case("trained/new_scenes")
    (obs,) = measure(folder / "runs" / "one_go.pt", [case]).values()
    assert not obs.error, obs.error


def test_the_evaluation_script_writes_the_metrics_of_a_checkpoint(course):
    folder, _ = course
    done = _run(folder, "evaluate_captioner.py", "runs/one_go.pt", "--images", "20", "--device", "cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads((folder / "runs" / "one_go.json").read_text())
    assert written["images"] == len(written["captions"]) == 20
    assert {"BLEU-4", "CIDEr", "exact_match"} <= set(written["scores"])
    assert sum(written["mistakes"].values()) == 20 and written["decoder"] == "greedy"


@pytest.mark.parametrize("script,args,words", [
    ("train_captioner.py", ["--steps", "0"], "--steps"),
    ("train_captioner.py", ["--lr", "-1"], "--lr"),
    ("train_captioner.py", ["--steps", "3", "--resume", "--checkpoint", "runs/none.pt"], "no checkpoint at"),
    ("evaluate_captioner.py", ["runs/none.pt"], "no checkpoint at"),
    ("evaluate_captioner.py", ["runs/one_go.pt", "--beam", "0"], "--beam"),
    ("train_captioner.py", ["--steps", "3", "--resume", "--checkpoint", "runs/damaged.pt"], "damaged or is not a checkpoint"),
    ("evaluate_captioner.py", ["runs/damaged.pt"], "damaged or is not a checkpoint"),
    *([("train_captioner.py", ["--steps", "3", "--device", "cuda"], "no CUDA device")]
      if not torch.cuda.is_available() else []),
])
def test_a_bad_command_line_ends_in_one_line_and_changes_nothing(course, script, args, words):
    folder, _ = course
    (folder / "runs" / "damaged.pt").write_bytes((folder / "runs" / "one_go.pt").read_bytes()[:300])
    before = {p: p.read_bytes() for p in (folder / "runs").iterdir()}
    done = _run(folder, script, *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and "Traceback" not in done.stderr and "error" in lines[-1] and words in lines[-1]
    assert {p: p.read_bytes() for p in (folder / "runs").iterdir()} == before


# ---- the checks ------------------------------------------------------------------------------------------------


def test_the_stand_in_resume_is_the_uninterrupted_run():
    """The resume case's stored weights are those of one run of all its steps: a resumed solution is compared with
    what it would have done without stopping."""
    case = load_case("train_script/one_run")
    adapter = with_train_script(_scripts()["train_captioner.py"])
    from grading.cases.captioning.training import train_script_cases
    spec = next(s for s in train_script_cases({}) if s.name == "train_script/resume")
    options = spec.const_kwargs["runs"][-1]
    one_go = [a for a in options if a != "--resume"]
    outs = []
    for runs in (spec.const_kwargs["runs"], [one_go]):
        torch.manual_seed(0)  # the same toy weights for both
        module = adapter(**spec.init)
        outs.append(module(spec.inputs["features"], spec.inputs["captions"], runs, spec.const_kwargs["val_rows"]))
    resumed_out, one_go_out = outs
    assert "--stop-at" in spec.const_kwargs["runs"][0]
    for a, b in zip(resumed_out[:2], one_go_out[:2]):  # the weights and the log
        assert torch.equal(torch.nan_to_num(a, nan=-7.0), torch.nan_to_num(b, nan=-7.0))
    assert case.name == "train_script/one_run"  # public: a student sees it


def _check_message(name, script):
    try:
        check(name, with_train_script(script) if name.startswith("train_") else with_eval_script(script))
    except CheckFailed as exc:
        return str(exc)
    return None


def test_the_solutions_scripts_pass_every_public_case():
    assert _check_message("train_script/one_run", _scripts()["train_captioner.py"]) is None
    assert _check_message("eval_script/greedy", _scripts()["evaluate_captioner.py"]) is None


@pytest.mark.parametrize("bug", sorted(TRAIN_SCRIPT_BUGS))
def test_each_known_training_script_bug_is_named(bug, hidden_references):
    messages = [m for name in ("train_script/one_run", "train_script/resume", "train_script/interrupted",
                               "train_script/resume_after_crash")
                if (m := _check_message(name, _train_script_bug(bug)))]
    assert messages, f"{bug} passed every case"
    assert any(TRAIN_SCRIPT_BUGS[bug][:40] in m for m in messages), messages


@pytest.mark.parametrize("bug", sorted(EVAL_SCRIPT_BUGS))
def test_each_known_evaluation_script_bug_is_named(bug, hidden_references):
    messages = [m for name in ("eval_script/greedy", "eval_script/beam")
                if (m := _check_message(name, _eval_script_bug(bug)))]
    assert any(EVAL_SCRIPT_BUGS[bug][:40] in m for m in messages), messages


def test_the_scripts_stand_ins_are_not_the_answers():
    """The stand-in step does not train (no gradient, no optimizer.step) and the stand-in schedule is not the task's."""
    from starter import scripts
    source = Path(scripts.__file__).read_text()
    assert "backward(" not in source and ".step()" not in source and "cos(" not in source
    assert not math.isclose(scripts._stand_in_schedule(0, 10, 2, 1.0), 0.5)


def test_run_command_shows_the_output_as_it_comes_and_says_whether_it_succeeded(tmp_path, capsys, monkeypatch):
    from starter.scripts import run_command
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("import sys\nprint('on stdout ✓')\nprint('on stderr', file=sys.stderr)\n"
                                   "sys.exit(int(sys.argv[1]))\n")
    assert run_command("s.py 0") is True
    assert run_command("s.py 3") is False
    shown = capsys.readouterr().out
    assert shown.count("on stdout ✓") == 2 and shown.count("on stderr") == 2


def test_notebook_06_runs_to_the_end_while_the_training_script_is_unfinished(tmp_path, monkeypatch):
    """Every piece done but what the script's checkpoint holds (Task 5, as released): the loop of Task 4 in the same
    file is graded, the notebook says in one line that the script does not pass yet, and no cell but Task 5's test
    cell fails (nothing trains, nothing is saved)."""
    import nbformat
    from nbclient import NotebookClient

    release = {notebooks.nbgrader_meta(c)["grade_id"]: c.source
               for c in notebooks.read(notebooks.RELEASE / f"{TRAINING_STEM}.ipynb").cells if notebooks.is_solution(c)}
    nb = notebooks.filled_submission(TRAINING_STEM, {"train_script": release["train_script"]})
    for stem in ("02_positional_encoding", "03_multi_head_attention", "04_captioning_data", "05_captioning_model"):
        nbformat.write(notebooks.filled_submission(stem), str(tmp_path / f"{stem}.ipynb"))
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setenv("COURSE_NOTEBOOKS_DIR", str(tmp_path))
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    failed, printed = [], ""
    for cell in nb.cells:
        if any(o.output_type == "error" for o in cell.get("outputs", [])):
            failed.append(notebooks.nbgrader_meta(cell).get("grade_id"))
        printed += "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")
    assert failed == ["test_train_script"], failed
    assert "✓ fit/basic passed" in printed
    assert "train_script: yours does not pass train_script/resume yet" in printed
    assert not (tmp_path / "runs" / "captioning_transformer.pt").exists()


def test_question_9_a_lost_random_state_shows_with_dropout_only(course, tmp_path, monkeypatch):
    """Notebook 06's question 9 (a): a restore that leaves torch's generator as new_model seeded it resumes to the
    weights of a run that never stopped at --dropout 0 (nothing else draws from it), and to other weights at
    --dropout 0.1 (the dropout masks are drawn again)."""
    from starter.scripts import Experiment, train_main
    folder, _ = course
    monkeypatch.setenv("COURSE_NOTEBOOKS_DIR", str(notebooks.SOLUTIONS))  # the model's layers load from there
    script = load_script(folder / "train_captioner.py")
    experiment = Experiment.open("shapes", device="cpu", folder=notebooks.SOLUTIONS)

    def restore_without_rng(saved, model, optimizer):
        seeded = torch.get_rng_state()
        step = script.restore(saved, model, optimizer)
        torch.set_rng_state(seeded)  # the generator stays as new_model seeded it
        return step

    def weights(dropout, stop_at):
        small = ["--steps", "6", "--warmup", "1", "--save-every", "2", "--batch-size", "8", "--d-model", "16",
                 "--heads", "2", "--layers", "1", "--dropout", dropout,
                 "--checkpoint", str(tmp_path / f"{dropout}-{stop_at}.pt")]
        runs = [small] if stop_at is None else [[*small, "--stop-at", stop_at], [*small, "--resume"]]
        for argv in runs:
            train_main(argv, experiment, fit=script.fit, checkpoint_state=script.checkpoint_state,
                       restore=restore_without_rng)
        return read_checkpoint(tmp_path / f"{dropout}-{stop_at}.pt")["state_dict"]

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in a)

    assert same(weights("0", None), weights("0", "3"))
    assert not same(weights("0.1", None), weights("0.1", "3"))


def test_a_runs_identity_ties_a_checkpoint_to_its_run_not_to_its_weights(course, tmp_path):
    """Two runs of the same code, seed and steps write the same weights under two identities; a run resumed from
    another's checkpoint (a classmate's file trained on) keeps that one's. Intake flags the students whose checkpoints
    share a run: one file handed in twice, or a run resumed from another's; never two independent runs."""
    import shutil

    from grading.intake import flag_shared_runs, run_identities
    from grading.notebooks import ASSIGNMENT, TRAINED_CHECKPOINT
    from grading.outcome import StudentOutcome

    folder, _ = course
    one_go, resumed, taken = (folder / "runs" / f"{n}.pt" for n in ("one_go", "resumed", "taken"))
    assert len(run_identities(one_go)) == 1 and run_identities(one_go) != run_identities(resumed)
    shutil.copy(one_go, taken)
    trained_on = _run(folder, "train_captioner.py", "--steps", "8", "--warmup", "1", "--save-every", "2",
                      "--batch-size", "8", "--d-model", "16", "--heads", "2", "--layers", "1", "--dropout", "0.2",
                      "--device", "cpu", "--resume", "--checkpoint", "runs/taken.pt")
    assert trained_on.returncode == 0, trained_on.stderr[-2000:]
    assert read_checkpoint(taken)["extra"]["step"] == 8 and run_identities(taken) == run_identities(one_go)

    handed_in = {"alice": one_go, "bob": one_go, "carol": resumed, "dave": taken, "erin": None}
    for student, checkpoint in handed_in.items():
        dest = tmp_path / "submitted" / student / ASSIGNMENT / TRAINED_CHECKPOINT
        dest.parent.mkdir(parents=True)
        if checkpoint is not None:
            shutil.copy(checkpoint, dest)
    results = [StudentOutcome(student=s) for s in handed_in]
    flag_shared_runs(tmp_path, results)
    flags = {r.student: r.flags for r in results}
    assert flags["carol"] == flags["erin"] == []
    for student, others in {"alice": "bob, dave", "bob": "alice, dave", "dave": "alice, bob"}.items():
        (flag,) = flags[student]
        assert f"same training run as the one {others} handed in" in flag and "stands" in flag
