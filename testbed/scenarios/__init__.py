"""Workloads run against a testbed cluster: shipped YAML scenarios and their runner."""
