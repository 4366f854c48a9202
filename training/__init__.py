"""Training: config schemas, loss, schedules, metrics, checkpoints, TensorBoard, the loop."""
