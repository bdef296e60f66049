"""Moving tensors between workers: the interface, its wire format, and the backends behind it."""
