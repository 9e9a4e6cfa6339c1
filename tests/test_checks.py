"""The checks that test cells call: one-line diagnoses of typical student bugs, and quiet."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

from grading.notebooks import RELEASE, SOLUTIONS, execute_definitions
from starter.checks import CheckFailed, check, load_case


@pytest.fixture(scope="module")
def ns():
    return execute_definitions(SOLUTIONS / "01_scaled_dot_product_attention.ipynb")


def _message(case, fn):
    with pytest.raises(CheckFailed) as info:
        check(case, fn)
    message = str(info.value)
    assert "\n" not in message, "messages are one line"
    return message


def _scores(q, k, scale=True):
    s = q @ k.transpose(-2, -1)
    return s / math.sqrt(q.shape[-1]) if scale else s


def test_solution_passes_and_prints_one_line(ns, capsys, hidden_references):
    check("sdpa/masked", ns["scaled_dot_product_attention"])
    check("sdpa/grad", ns["scaled_dot_product_attention"])
    out = capsys.readouterr()
    assert out.out.splitlines() == ["\u2713 sdpa/masked passed", "\u2713 sdpa/grad passed"]
    assert out.err == ""


def _half_softmaxes(q, k):
    s = _scores(q, k)
    n = s.shape[-1] // 2
    return torch.cat([torch.softmax(s[..., :n], -1), torch.softmax(s[..., n:], -1)], -1)


@pytest.mark.parametrize("bug, expected", [
    (lambda q, k, v, mask=None: None, "returned None"),
    (lambda q, k, v, mask=None: (_ for _ in ()).throw(NotImplementedError()), "not implemented yet"),
    (lambda q, k, v, mask=None: 1 / 0, "raised ZeroDivisionError"),
    (lambda q, k, v, mask=None: torch.zeros(2), "returned one Tensor; expected a tuple (output, weights)"),
    (lambda q, k, v, mask=None: ([1.0], [2.0]), "returned list for `output`; expected a torch.Tensor"),
    (lambda q, k, v, mask=None: ((torch.softmax(_scores(q, k), -1) @ v).transpose(-2, -1),
                                 torch.softmax(_scores(q, k), -1)), "axes [-2, -1] are swapped"),
    (lambda q, k, v, mask=None: (torch.softmax(_scores(q, k, False), -1) @ v, torch.softmax(_scores(q, k, False), -1)),
     "looks unscaled"),
    (lambda q, k, v, mask=None: (torch.softmax(_scores(q, k), -2) @ v, torch.softmax(_scores(q, k), -2)),
     "softmax taken over the queries"),
    # a softmax over each half of the keys: the rows sum to 2; the message says so, not "apply a softmax"
    (lambda q, k, v, mask=None: (_half_softmaxes(q, k) @ v, _half_softmaxes(q, k)),
     "don't sum to 1 over the keys"),
    # right weights returned transposed: they sum to 1 along axis -2 too, but the softmax was right
    (lambda q, k, v, mask=None: (torch.softmax(_scores(q, k), -1) @ v, torch.softmax(_scores(q, k), -1).mT),
     "last two axes swapped"),
])
def test_named_bugs_unmasked(bug, expected):
    assert expected in _message("sdpa/basic", bug)


def _masked(after=False, fill=float("-inf"), invert=False):
    def fn(q, k, v, mask=None):
        s = _scores(q, k)
        m = ~mask if invert else mask
        if not after:
            s = s.masked_fill(~m, fill)
        w = torch.softmax(s, -1)
        if after:
            w = w * m
        return w @ v, w
    return fn


@pytest.mark.parametrize("bug, expected", [
    (_masked(after=True), "mask applied after the softmax"),
    (_masked(fill=0.0), "instead of -inf"),
    (_masked(invert=True), "mask convention inverted"),
    (lambda q, k, v, mask=None: (torch.softmax(_scores(q, k), -1) @ v, torch.softmax(_scores(q, k), -1)),
     "non-zero at masked positions"),
])
def test_named_bugs_masked(bug, expected):
    assert expected in _message("sdpa/masked", bug)


def test_dtype_and_gradient_bugs(ns, hidden_references):
    sdpa = ns["scaled_dot_product_attention"]

    def float32_only(q, k, v, mask=None):
        out, w = sdpa(q.float(), k.float(), v.float(), mask)
        return out, w

    assert "dtype torch.float32, expected torch.float64" in _message("sdpa/float64", float32_only)

    def detached(q, k, v, mask=None):
        out, w = sdpa(q, k, v, mask)
        return out.detach(), w.detach()

    assert "not connected" in _message("sdpa/grad", detached)


def test_an_exception_names_the_situation_of_its_case():
    """A crash says on what it happened (shapes, sizes), as a comparison failure does by its index."""
    message = _message("sdpa/masked", lambda q, k, v, mask=None: 1 / 0)
    assert "`scaled_dot_product_attention(q: (2, 5, 4) float32, k: (2, 5, 4) float32, v: (2, 5, 4) float32, " \
           "mask: (5, 5) bool)` raised ZeroDivisionError" in message, message

    class Crashing(torch.nn.Module):
        def __init__(self, embed_dim, head_dim=None):
            super().__init__()
            self.query, self.key, self.value = (torch.nn.Linear(embed_dim, head_dim, bias=False) for _ in range(3))

        def forward(self, x):
            raise IndexError("index 5 is out of bounds")

    message = _message("selfattn/basic", Crashing)
    assert "`SelfAttention(embed_dim=8, head_dim=4)` on x: (2, 5, 8) float32 raised IndexError" in message, message
    assert "not implemented yet" in _message("sdpa/basic", lambda q, k, v, mask=None: (_ for _ in ()).throw(
        NotImplementedError())), "an unfilled answer is told so, not shown its case"


def test_causal_mask_bugs():
    assert "off by one" in _message("causal/5", lambda T: torch.ones(T, T, dtype=torch.bool).tril(-1))
    assert "expected torch.bool" in _message("causal/5", lambda T: torch.ones(T, T).tril())
    assert "inverted" in _message("causal/5", lambda T: torch.ones(T, T, dtype=torch.bool).triu(1))


def test_module_bugs(ns):
    class WrongLayers(torch.nn.Module):
        def __init__(self, embed_dim, head_dim=None):
            super().__init__()
            self.qkv = torch.nn.Linear(embed_dim, 3 * head_dim)

    assert "parameters don't match" in _message("selfattn/basic", WrongLayers)
    assert "should be an nn.Module class" in _message("selfattn/basic", lambda x: x)

    class Swapped(ns["SelfAttention"]):
        def forward(self, x, mask=None):
            return ns["scaled_dot_product_attention"](self.key(x), self.query(x), self.value(x), mask)

    assert "swapped" in _message("selfattn/basic", Swapped)


def test_builtin_attention_is_refused():
    def uses_torch(q, k, v, mask=None):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return out, torch.softmax(_scores(q, k), -1)

    assert "implement it yourself" in _message("sdpa/basic", uses_torch)
    # and the tripwire is removed afterwards
    q = torch.randn(2, 3, 4)
    assert torch.nn.functional.scaled_dot_product_attention(q, q, q).shape == q.shape


def test_checks_are_quiet(ns, capsys):
    def noisy(q, k, v, mask=None):
        warnings.warn("student warning", stacklevel=2)
        import sys
        print("to stderr", file=sys.stderr)
        return ns["scaled_dot_product_attention"](q, k, v, mask)

    check("sdpa/basic", noisy)
    assert capsys.readouterr().err == ""


def test_failure_renders_as_one_line_in_ipython():
    try:
        check("causal/5", lambda T: None)
    except CheckFailed as exc:
        rendered = exc._render_traceback_()
    assert len(rendered) == 1 and "returned None" in rendered[0]


@pytest.mark.parametrize("module, name", [("starter.checks", "check"), ("starter.checks", "load_case"),
                                          ("starter.compare", "observe"), ("starter.compare", "verdict"),
                                          ("starter.compare", "__all__")])
def test_a_cell_cannot_replace_the_checks_or_the_comparison_they_run(module, name):
    # a test cell that imports `check` again gets the real one, and `check` calls the real comparison
    import importlib
    mod = importlib.import_module(module)
    with pytest.raises(AttributeError, match="read-only"):
        setattr(mod, name, print)
    with pytest.raises(AttributeError, match="read-only"):
        delattr(mod, name)
    assert getattr(mod, name) is not print


def test_missing_hidden_case_says_so(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_HIDDEN_REFERENCES", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckFailed, match="only while grading"):
        load_case("sdpa/grad")


def test_an_exception_in_a_helper_names_the_helper_and_its_line():
    """The failing line is in a helper of another cell: the message names that helper, not "your cell"."""
    src = "def helper(x):\n    '''a docstring line'''\n    return x.no_such_attribute\n"
    namespace: dict = {}
    exec(compile(src, "<cell-7>", "exec"), namespace)

    def attention_loop(query, keys, values):
        return namespace["helper"](query)

    with pytest.raises(CheckFailed, match=r"raised AttributeError: .* \(line 3 of the cell that defines `helper`\)"):
        check("loop/basic", attention_loop)


def test_check_public_runs_every_public_case_and_counts_failures(ns, capsys, monkeypatch):
    from starter.checks import check_public
    from starter.compare import RESULTS_ENV

    monkeypatch.delenv(RESULTS_ENV, raising=False)
    buggy = dict(ns, causal_mask=lambda T, device=None: torch.ones(T, T, dtype=torch.bool).tril(-1),
                 SelfAttention=None)
    assert check_public("01_scaled_dot_product_attention", buggy) == 2
    out = capsys.readouterr().out
    assert "\u2717 causal/5:" in out and "\u2717 selfattn/basic:" in out and "\u2713 sdpa/masked passed" in out
    assert "3 of 5 public cases of 01_scaled_dot_product_attention pass; fix the 2" in out
    # the release notebook, nothing filled in: every case fails with its one line, nothing raises
    release = execute_definitions(RELEASE / "03_multi_head_attention.ipynb")
    assert check_public("03_multi_head_attention", release) == 7
    assert "not implemented yet" in capsys.readouterr().out
    monkeypatch.setenv(RESULTS_ENV, "/nonexistent")  # while grading: nothing runs
    assert check_public("01_scaled_dot_product_attention", buggy) == 0
    assert "skipped while grading" in capsys.readouterr().out


@pytest.mark.parametrize("body,words", [
    ("w = torch.softmax(q @ k.T / math.sqrt(q.shape[1]), dim=1)\n    return w @ v, w", "multiplies whole matrices"),
    ("s = torch.stack([torch.stack([q[j] @ k[i] for i in range(len(k))]) for j in range(len(q))]) / math.sqrt(q.shape[1])\n"
     "    w = torch.softmax(s, dim=1)\n    return torch.stack([sum(w[j, i] * v[i] for i in range(len(k))) for j in range(len(q))]), w",
     "calls `torch.softmax`"),
])
def test_the_loop_task_refuses_what_its_text_rules_out(body, words):
    """Task 1 is written with loops and a softmax written out: whole-matrix products and a ready-made softmax
    are named; a dot product of two vectors with `@` is allowed (the solution's loops pass, see above)."""
    namespace: dict = {"torch": torch, "math": math}
    exec(f"def attention_loop(q, k, v):\n    {body}\n", namespace)
    with pytest.raises(CheckFailed, match=words):
        check("loop/basic", namespace["attention_loop"])


def test_the_loop_task_allows_vector_dot_products_with_the_at_operator():
    namespace: dict = {"torch": torch, "math": math}
    exec("def attention_loop(q, k, v):\n"
         "    w = torch.zeros(len(q), len(k))\n"
         "    for j in range(len(q)):\n"
         "        s = torch.stack([q[j] @ k[i] for i in range(len(k))]) / math.sqrt(q.shape[1])\n"
         "        e = torch.exp(s - s.max())\n"
         "        w[j] = e / e.sum()\n"
         "    return torch.stack([sum(w[j, i] * v[i] for i in range(len(k))) for j in range(len(q))]), w\n", namespace)
    check("loop/basic", namespace["attention_loop"])


# Vectorised attention loops that reach torch's products and softmax by another name than the one a check could
# swap out: an alias taken before the check runs, a name imported from torch, torch.ops, other spellings.
ALIASED_LOOPS = {
    "alias": ("_m, _s = torch.matmul, torch.softmax\n",
              "w = _s(_m(q, k.T) / math.sqrt(q.shape[1]), dim=-1)\n    return _m(w, v), w",
              "multiplies whole matrices (`torch.matmul`)"),
    "imported_softmax": ("from torch.nn.functional import softmax\n",
                         "s = torch.stack([torch.stack([q[j] @ k[i] for i in range(len(k))]) for j in range(len(q))])\n"
                         "    w = softmax(s / math.sqrt(q.shape[1]), dim=-1)\n"
                         "    return torch.stack([sum(w[j, i] * v[i] for i in range(len(k))) for j in range(len(q))]), w",
                         "calls `torch.nn.functional.softmax`"),
    "softmax_module": ("", "s = torch.stack([torch.stack([q[j] @ k[i] for i in range(len(k))]) for j in range(len(q))])\n"
                       "    w = torch.nn.Softmax(dim=-1)(s / math.sqrt(q.shape[1]))\n"
                       "    return torch.stack([sum(w[j, i] * v[i] for i in range(len(k))) for j in range(len(q))]), w",
                       "calls `torch.nn.functional.softmax`"),
    "exp_of_log_softmax": ("", "s = torch.stack([torch.stack([q[j] @ k[i] for i in range(len(k))]) for j in range(len(q))])\n"
                           "    w = torch.log_softmax(s / math.sqrt(q.shape[1]), -1).exp()\n"
                           "    return torch.stack([sum(w[j, i] * v[i] for i in range(len(k))) for j in range(len(q))]), w",
                           "calls `torch.log_softmax`"),
    "aten_op": ("", "e = torch.exp(torch.ops.aten.mm(q, k.T) / math.sqrt(q.shape[1]))\n"
                "    w = e / e.sum(-1, keepdim=True)\n    return torch.stack([sum(w[j, i] * v[i] for i in range(len(k))) "
                "for j in range(len(q))]), w", "multiplies whole matrices (`torch.ops.aten.mm`)"),
    "einsum_and_linear": ("", "e = torch.exp(torch.einsum('md,nd->mn', q, k) / math.sqrt(q.shape[1]))\n"
                          "    w = e / e.sum(-1, keepdim=True)\n    return torch.nn.functional.linear(w, v.T), w",
                          "multiplies whole matrices (`torch.einsum`)"),
    "overrides_off": ("", "with torch._C.DisableTorchFunction():\n        w = torch.softmax(q @ k.T / math.sqrt(q.shape[1]), -1)\n"
                      "    return w @ v, w", "multiplies whole matrices (`aten.mm`)"),
}


@pytest.mark.parametrize("name", sorted(ALIASED_LOOPS))
def test_the_loop_rules_hold_whatever_name_reaches_torch(name):
    """The loop task's rules watch every operation torch runs while the case runs, not the names a check could
    swap: an alias taken before the check (`_m, _s = torch.matmul, torch.softmax`) is refused with the same line
    as torch.matmul itself, naming what the code called, and torch's own attributes are back afterwards."""
    before, body, words = ALIASED_LOOPS[name]
    namespace: dict = {"torch": torch, "math": math}
    exec(f"{before}def attention_loop(q, k, v):\n    {body}\n", namespace)
    originals = (torch.matmul, torch.softmax, torch.Tensor.__matmul__, torch.nn.functional.softmax)
    message = _message("loop/basic", namespace["attention_loop"])
    assert message.startswith("loop/basic: `attention_loop` ") and words in message, message
    assert (torch.matmul, torch.softmax, torch.Tensor.__matmul__, torch.nn.functional.softmax) == originals
    assert torch._C._len_torch_function_stack() == 0, "the check's watch outlived the check"
    q = torch.randn(2, 3)
    torch.testing.assert_close(q @ q.T, torch.mm(q, q.T))  # torch works as before once the check is over
    assert torch.softmax(q, -1).sum(-1).allclose(torch.ones(2))


def test_the_loop_rules_let_the_written_out_loop_run_with_dot_products_of_any_spelling():
    """The rules refuse products of whole matrices, not dot products: `torch.dot`, a vector `@` a vector, a
    one-element einsum and a (1, D) @ (D, 1) product all pass, as exp and sum do."""
    namespace: dict = {"torch": torch, "math": math}
    exec("def attention_loop(q, k, v):\n"
         "    dots = [torch.dot, lambda a, b: a @ b, lambda a, b: torch.einsum('i,i->', a, b),\n"
         "            lambda a, b: (a[None] @ b[:, None])[0, 0]]\n"
         "    w = torch.zeros(len(q), len(k), dtype=q.dtype)\n"
         "    for j in range(len(q)):\n"
         "        s = torch.stack([dots[(i + j) % 4](q[j], k[i]) for i in range(len(k))]) / math.sqrt(q.shape[1])\n"
         "        e = torch.exp(s - s.max())\n"
         "        w[j] = e / e.sum()\n"
         "    return torch.stack([sum(w[j, i] * v[i] for i in range(len(k))) for j in range(len(q))]), w\n", namespace)
    check("loop/basic", namespace["attention_loop"])


def test_a_trained_model_is_measured_by_its_exact_captions(capsys):
    """The trained-model cases count captions that are one of their image's references, word for word up to
    <END> (any phrasing; what follows <END> does not count), against the case's mark; a pass shows both figures
    on its line, and nothing goes to stderr (nbgrader gives a cell that writes there no points)."""
    from starter.checks import load_case

    case = load_case("trained/new_scenes")
    refs = torch.from_numpy(case.expected["captions"])  # (N, 3, L)

    def captioner(right: float):
        def captions(features, words):
            out = refs[torch.arange(len(refs)), torch.arange(len(refs)) % 3].clone()  # every phrasing in turn
            out[:, -1] = words.index("red")  # after <END>: ignored
            out[int(len(out) * right):, 0] = words.index("<UNK>")
            return out
        return captions

    capsys.readouterr()
    check("trained/new_scenes", captioner(0.9))
    shown = capsys.readouterr()
    assert shown.out == ("\u2713 trained/new_scenes passed: the model captions 90% of the 100 new scenes exactly "
                         "right (this case asks for 65%)\n") and not shown.err, shown
    message = _message("trained/new_scenes", captioner(0.5))
    assert "captions 50% of these 100 images exactly right" in message and "asks for 65%" in message, message
    assert "expected (100, words) integer captions" in _message("trained/new_scenes", lambda f, w: f[:, :, 0])


def test_no_name_of_the_checks_modules_can_be_replaced():
    """A cell that swaps a private helper of the comparison (the watch that enforces "don't call the built-in") or the
    module's class back would switch the rules off for every check after it."""
    import types

    import starter.checks
    import starter.compare
    import starter.fast

    for module, name in ((starter.compare, "_watching"), (starter.compare, "_tripwires"), (starter.compare, "observe"),
                         (starter.checks, "check"), (starter.fast, "toy_step"), (starter.compare, "__class__")):
        with pytest.raises(AttributeError, match="read-only"):
            setattr(module, name, types.ModuleType if name == "__class__" else print)
        with pytest.raises(AttributeError, match="read-only"):
            delattr(module, name)


def test_a_thread_started_elsewhere_while_a_check_runs_is_left_alone():
    """A case with rules refuses threads started by the code it checks (the rules' watch is per thread), not those
    the kernel's own threads start meanwhile."""
    import threading

    from starter.compare import THREAD_STARTS, _tripwires

    go, finished, ran = threading.Event(), threading.Event(), []

    def elsewhere():
        go.wait(5)
        inner = threading.Thread(target=lambda: ran.append(1))
        inner.start()
        inner.join()
        finished.set()

    helper = threading.Thread(target=elsewhere)
    helper.start()
    with _tripwires(list(THREAD_STARTS)):
        go.set()
        assert finished.wait(5)
        with pytest.raises(Exception, match="threading.Thread.start"):
            threading.Thread(target=lambda: None).start()
    helper.join()
    assert ran == [1]
