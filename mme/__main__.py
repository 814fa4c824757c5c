from mme.cli import entry_point

entry_point()
