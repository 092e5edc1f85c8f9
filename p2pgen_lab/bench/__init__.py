"""Benchmarks, printed as tables side by side with their baselines (`p2pgen bench ...`)."""
