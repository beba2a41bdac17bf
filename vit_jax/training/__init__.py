"""Training: the plan, the state and its step, the loop."""
