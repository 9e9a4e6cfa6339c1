"""Set-up files agree with each other."""
from __future__ import annotations

import re

from grading.notebooks import ROOT


def _pins(text: str) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^[\s-]*([A-Za-z0-9_.-]+)==([^\s#]+)", text, re.M)}


def test_environment_yml_matches_requirements():
    req = _pins((ROOT / "requirements.txt").read_text())
    env = _pins((ROOT / "environment.yml").read_text())
    assert req == env, {k: (req.get(k), env.get(k)) for k in set(req) | set(env) if req.get(k) != env.get(k)}


def test_reference_files_ship_with_the_package():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'starter = ["references/*.h5"]' in text
    assert list((ROOT / "starter" / "references").glob("*.h5")), "no public reference files"
