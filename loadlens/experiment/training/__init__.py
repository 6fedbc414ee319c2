"""The training procedures of guide 2.3 and 2.5 (``kind: training`` experiments): docs/training.md."""
