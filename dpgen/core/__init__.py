"""Method-independent machinery: the released-generator artifact, checkpoints, the run context and pipeline."""
