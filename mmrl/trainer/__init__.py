"""The shared training loop (see `mmrl.trainer.trainer.Trainer`)."""
