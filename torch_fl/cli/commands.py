"""Imports every command module so each registers its commands on the app."""
from torch_fl.cli import platforms  # noqa: F401
from torch_fl.cli import routes  # noqa: F401
from torch_fl.cli import info  # noqa: F401
from torch_fl.cli import onboard  # noqa: F401
from torch_fl.cli import kernel  # noqa: F401
from torch_fl.cli import skills  # noqa: F401
from torch_fl.cli import triage  # noqa: F401
from torch_fl.cli import conformance  # noqa: F401
