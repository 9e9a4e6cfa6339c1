"""Reference cases of notebook 05 (the captioning Transformer: training and evaluation), made in grading.cases.captioning."""
from grading.cases.captioning import cases_of


def cases(ns):
    return cases_of("05", ns)
