"""Writes a torch.save file with a storage over 4 GiB (ZIP64 sizes and offsets), for the large
test that runs only with ZCKPT_PT_LARGE_TESTS=1.

Usage: make_large_fixture.py OUT
"""
import sys

import torch

big = torch.zeros((1 << 32) + 4099, dtype=torch.uint8)
big[0], big[1 << 32], big[-1] = 1, 2, 3
torch.save({"before": torch.arange(10), "big": big, "after": torch.arange(5, dtype=torch.int16)}, sys.argv[1])
