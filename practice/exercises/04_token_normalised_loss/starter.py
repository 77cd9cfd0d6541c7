"""Exercise 04: the token-normalised loss across ranks (chapter 2).

Read practice/exercises/04_token_normalised_loss/README.md, write the
function, then grade it:  python practice/judge.py 04
"""

import torch
import torch.distributed as dist


def token_normalised_loss(token_losses, mask):
    """This rank's loss, so that averaging gradients over ranks gives the global
    per-token mean's."""
    raise NotImplementedError("write token_normalised_loss")
