"""The student's session: the course folder, loading earlier notebooks from it, and one-line errors."""
from __future__ import annotations

import os
import shutil
import sys

import nbformat
import pytest
import torch
from conftest import filled_submission, write_nb
from nbclient import NotebookClient

from grading import notebooks as nbs
from starter import runtime
from starter.layers import LayerLoadError, get_layers
from starter.notebook_loader import NotebookLoadError, find_notebook, load_definitions


def test_earlier_notebooks_come_from_the_course_folder_never_from_the_kit(tmp_path, monkeypatch):
    monkeypatch.delenv(runtime.NOTEBOOKS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotebookLoadError, match=f"can't find your 02_positional_encoding.ipynb in {tmp_path}"):
        find_notebook("02_positional_encoding.ipynb")  # the kit's blank copy in notebooks/ is not taken
    # a copy renamed by Colab or a browser download is found, the newest when there are several
    older = write_nb(filled_submission("02_positional_encoding"), tmp_path / "02_positional_encoding (1).ipynb")
    newer = write_nb(filled_submission("02_positional_encoding"), tmp_path / "Copy of 02_positional_encoding.ipynb")
    os.utime(older, (1, 1))
    assert find_notebook("02_positional_encoding.ipynb") == newer
    loaded = load_definitions("02_positional_encoding.ipynb", ["sinusoidal_encoding"])
    assert loaded.path == newer and callable(loaded["sinusoidal_encoding"])
    # $COURSE_NOTEBOOKS_DIR (set by the Colab set-up to the Drive folder) wins over the working folder
    other = tmp_path / "drive"
    other.mkdir()
    monkeypatch.setenv(runtime.NOTEBOOKS_ENV, str(other))
    with pytest.raises(NotebookLoadError, match=str(other)):
        find_notebook("02_positional_encoding.ipynb")


def test_layers_name_the_file_they_came_from(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.chdir(tmp_path)
    write_nb(filled_submission("02_positional_encoding"), tmp_path / "02_positional_encoding.ipynb")
    shutil.copy(nbs.RELEASE / "03_multi_head_attention.ipynb", tmp_path)  # 03 untouched: not implemented
    with pytest.raises(LayerLoadError, match=f"{tmp_path}/03_multi_head_attention.ipynb.*not implemented yet"):
        get_layers("mine", folder=tmp_path)
    write_nb(filled_submission("03_multi_head_attention"), tmp_path / "03_multi_head_attention.ipynb")
    get_layers("mine", folder=tmp_path, verbose=True)  # reloaded: the file changed
    out = capsys.readouterr().out
    assert f"from {tmp_path}/03_multi_head_attention.ipynb" in out and f"from {tmp_path}/02_" in out, out


def test_missing_checkpoint_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = runtime.missing_checkpoint("runs/captioning_transformer.pt")
    assert f"no trained model at {tmp_path}/runs/captioning_transformer.pt" in line and "\n" not in line
    assert "Colab" not in line
    monkeypatch.setitem(sys.modules, "google.colab", object())
    line = runtime.missing_checkpoint("runs/captioning_transformer.pt")
    assert "USE_DRIVE = True" in line and f"upload your captioning_transformer.pt to {tmp_path}/runs" in line


def test_unfinished_tasks_show_one_line_and_do_not_cascade():
    cells = [
        "from starter.runtime import start_notebook\nstart_notebook()",
        "def attention(x):\n    raise NotImplementedError()\nclass Layer:\n    def forward(self):\n        raise NotImplementedError()",
        "weights = attention(1)",          # stops: attention is not finished
        "out = Layer().forward()",
        "print(weights)",                 # would be a NameError cascade
        "print(never_defined_anywhere)",  # a real NameError keeps its traceback
        "from starter.layers import get_layers\nget_layers('mine', folder='/nonexistent')",  # kit's one-line error
        "layers = get_layers('mine', folder='/nonexistent')",
        "print(layers)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=60).execute()
    errors = [[o for o in c.outputs if o.output_type == "error"] for c in nb.cells]
    assert not errors[0] and not errors[1]
    assert all(errors[i] for i in (2, 3, 4, 5, 6, 7, 8)), [[o.get("text", o.get("evalue")) for o in c.outputs] for c in nb.cells]
    one_line = {i: errors[i][0].traceback for i in (2, 3, 4, 6, 7, 8)}
    assert all(len(tb) == 1 for tb in one_line.values()), one_line
    assert "`attention` is not implemented yet" in one_line[2][0]
    assert "`Layer.forward` is not implemented yet" in one_line[3][0]
    assert "`weights` was never set" in one_line[4][0] and "`attention` is not implemented yet" in one_line[4][0]
    assert "LayerLoadError" in one_line[6][0] and "`layers` was never set" in one_line[8][0]
    assert len(errors[5][0].traceback) > 1 and errors[5][0].ename == "NameError"
    assert not [o for c in nb.cells for o in c.outputs if o.output_type == "stream" and o.name == "stderr"]


def _plain_tensor_attributes(module) -> list[str]:
    """Tensors held as plain attributes: `.to(device)` would leave them behind (a GPU run then fails)."""
    return [f"{type(m).__name__}.{k}" for m in module.modules() for k, v in vars(m).items()
            if isinstance(v, torch.Tensor)]


def test_every_tensor_of_the_models_moves_with_to(monkeypatch):
    """The GPU path: parameters and buffers only, so that `model.to(device)` moves everything."""
    plain = torch.nn.Module()
    plain.table = torch.zeros(3)  # the bug this looks for: a table that stays on the CPU
    assert _plain_tensor_attributes(plain) == ["Module.table"]
    monkeypatch.setenv(runtime.NOTEBOOKS_ENV, str(nbs.SOLUTIONS))  # "mine" = the reference solutions
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    captioner = load_definitions("05_captioning_model.ipynb", ["CaptioningTransformer"])["CaptioningTransformer"]
    for layers in ("mine", "torch"):
        model = captioner(vocab_size=11, feature_dim=6, num_regions=4, layers=layers)
        assert not _plain_tensor_attributes(model), (layers, _plain_tensor_attributes(model))
        model.to(torch.float64)
        assert {t.dtype for t in [*model.parameters(), *model.buffers()]} == {torch.float64}, layers
