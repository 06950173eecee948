"""DUPA's gate (issue 47): a short training in which the aligned tokens of two images of the same
class stay clearly less alike than the two paths of one image (`collapse_check.passes_gate`).

The re-test's alignment (align_head "centred", align_label "null") must pass it; the first two
studies' projector fails it (one direction for every image by step ~40: the planted failure),
and so does centring alone once the encoder has learnt to write the label into the tokens both
paths share (by step ~450). Numbers: methods/dupa/README.md, "Re-test (issue 47)".
"""

import jax.numpy as jnp
import pytest

from configs.dupa import ALIGNS
from core import digits
from methods.dupa import collapse_check

# The length of the first two studies' runs; the label code appeared between steps 350 and 450.
LONG_STEPS = 450
# Centring alone, the tokens of the training forward (which sees the label both paths share).
CENTRED_SHARED = dict(align_head="centred", align_label="shared", align_loss="cosine")


@pytest.fixture(scope="module")
def validation():
    split = digits.load_splits().validation
    return jnp.asarray(split.images), jnp.asarray(split.labels)


def run_gate(validation, align: dict, steps: int = collapse_check.GATE_STEPS) -> dict:
    metrics = collapse_check.gate(collapse_check.gate_config(align, steps=steps), *validation)
    print(align, steps, metrics)  # the numbers README cites: pytest -s
    return metrics


# ~40 s on the 2-core machine at load ~9 (50 steps at the experiment's size, 4 measurements).
def test_dupa_gate_passes_with_the_retest_alignment(validation):
    metrics = run_gate(validation, ALIGNS["retest"])
    assert collapse_check.passes_gate(metrics), metrics


@pytest.mark.slow  # ~40 s at load ~9: the planted failure of the gate above
def test_dupa_gate_fails_on_the_first_studies_projector(validation):
    metrics = run_gate(validation, ALIGNS["projector"])
    assert not collapse_check.passes_gate(metrics), metrics
    assert metrics["aligned"]["cross"] > 0.99  # one direction for every image


@pytest.mark.slow  # two 450-step trainings: ~4 min at load ~9
def test_dupa_gate_over_450_steps_needs_the_null_label(validation):
    shared = run_gate(validation, CENTRED_SHARED, LONG_STEPS)
    assert not collapse_check.passes_gate(shared), shared  # a code of the label
    retest = run_gate(validation, ALIGNS["retest"], LONG_STEPS)
    assert collapse_check.passes_gate(retest), retest
