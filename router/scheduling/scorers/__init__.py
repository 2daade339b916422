"""Scorers, a module a concern: ``prefix`` (what each endpoint holds of
the prompt), ``prefill`` (what stands before a first token, and how near
the prefill ran), ``load`` (spreading the work) and ``session`` (a
session's endpoint). Each scores candidates in [0, 1]."""
