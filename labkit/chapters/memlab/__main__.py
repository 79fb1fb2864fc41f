"""The allocator demo's own process (taught in chapter 08): ``python -m labkit.chapters.memlab --fragment``
runs both fragmentation patterns in this fresh process and prints their numbers as one JSON line, which
memlab.fragmentation_demo reads back."""
import json
import sys

from .fragmentation import _fragment

if __name__ == "__main__" and "--fragment" in sys.argv:
    print(json.dumps(_fragment()))
