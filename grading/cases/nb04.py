"""Reference cases of notebook 04 (the captioning Transformer: data and model), made in grading.cases.captioning."""
from grading.cases.captioning import cases_of


def cases(ns):
    return cases_of("04", ns)
