"""Launching training recipes on hosts through torchrun and Slurm, and following them."""
