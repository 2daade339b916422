"""Scorers, a module a concern: ``prefix`` (what each endpoint holds of
the prompt), ``prefill`` (what stands before a first token, and how near
the prefill ran), ``load`` (spreading the work) and ``session`` (a
session's endpoint). Each scores candidates in [0, 1]."""

from toposerve.router.scheduling.scorers.prefix import APPROX_BLOCK_BYTES, approx_match

# what the disaggregation stage reads to weigh a split against its cost
__all__ = ["APPROX_BLOCK_BYTES", "approx_match"]
