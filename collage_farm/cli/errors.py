"""What the command line treats as the user's mistake: one line on stderr, exit status 2.

`USER_ERRORS` are the exceptions `collage_farm.cli.main.main` turns into
``collage-farm CMD: error: MESSAGE`` and `EXIT_USAGE`: a bad model, plan, target, config, cost
table or path, a search with no cover, and `UserError` (an option combination argparse cannot
check). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collage_farm.config import ConfigError
from collage_farm.core.graph import ModelError
from collage_farm.core.plan import PlanError
from collage_farm.core.search import NoCoverError
from collage_farm.core.target import UnknownTargetError
from collage_farm.costtable import CostTableError
from collage_farm.farm import FarmError
from estimators.table import MissingCostsError

__all__ = ["EXIT_USAGE", "USER_ERRORS", "UserError"]

EXIT_USAGE = 2


class UserError(Exception):
    """A command's arguments do not make sense together; the message says which and why."""


#: path problems are the user's to fix too, and their message names the path
USER_ERRORS: tuple[type[BaseException], ...] = (
    ModelError, PlanError, NoCoverError, UnknownTargetError, UserError, FileNotFoundError,
    NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError, ConfigError,
    CostTableError, FarmError, MissingCostsError)
