"""Capacity planning on history: workload profiles, right-sizing, consolidation by MIG / MPS /
time-slicing, queue waits. A stage of its own between price and recommend: it reads the
sample sources measure opens and the prices price resolves, and hands its findings to the
recommender (docs/planning.md)."""
