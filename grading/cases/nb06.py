"""Reference cases of notebook 06 (the captioning Transformer: decoding), made in grading.cases.captioning."""
from grading.cases.captioning import cases_of


def cases(ns):
    return cases_of("06", ns)
