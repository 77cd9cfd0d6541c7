"""Exercise 2.2: the token-normalised loss across ranks (chapter 2).

Read practice/exercises/04_token_normalised_loss/README.md, write the
function, then grade it:  python practice/judge.py 2.2
"""

import torch
import torch.distributed as dist


def token_normalised_loss(token_losses, mask):
    """This rank's loss, normalised for averaging gradients over ranks.

    Averaged over ranks, its gradients are those of the global per-token mean.
    """
    raise NotImplementedError("write token_normalised_loss")
