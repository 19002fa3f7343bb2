pytest_plugins = ["testbed.testing"]
