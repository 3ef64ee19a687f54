"""The one log line every RNN model writes when it is built: which initialisation it starts
from, and whether that is its paper's (issue 18: a silent slow default was a trap)."""
import logging

logger = logging.getLogger("fairseq_plugins.models")


def log_initialisation(arch: str, init: str, paper: str) -> None:
    if init == "paper":
        logger.info(f"{arch}: initialisation paper ({paper})")
    else:
        logger.info(f"{arch}: initialisation {init} (the paper's is --init paper)")
