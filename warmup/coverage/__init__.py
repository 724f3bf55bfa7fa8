"""Coverage: plan classes against compile keys, the second-pass check, audit, learn, traffic."""
