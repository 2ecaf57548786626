"""Pauses tensor capture (`vramtrace_torch.pause()`, `resume()`) between blocks of the stand-in
torch, and prints what each block's records should be: `recorded PTR` for a block allocated
while capture ran (its allocation and its release recorded), `unrecorded PTR` for one allocated
while paused (neither recorded, when the trace has a live-tensor table; its release otherwise).
The stand-in allocator never hands out an address twice."""
import os

import torch
import vramtrace_torch


def say(what, ptr):
    os.write(1, f"{what} {ptr}\n".encode())


a = torch.cuda.fake_alloc(4096)
b = torch.cuda.fake_alloc(8192)
assert not vramtrace_torch.pause("a warm-up")
c = torch.cuda.fake_alloc(16384)
torch.cuda.fake_free(c, 16384)
torch.cuda.fake_free(b, 8192)  # recorded before the pause: its release is recorded
d = torch.cuda.fake_alloc(2048)  # released after the resume
assert vramtrace_torch.pause()  # already paused: no second note
assert vramtrace_torch.resume()
e = torch.cuda.fake_alloc(32768)
torch.cuda.fake_free(d, 2048)
torch.cuda.fake_free(a, 4096)
torch.cuda.fake_free(e, 32768)
for what, ptr in (("recorded", a), ("recorded", b), ("unrecorded", c), ("unrecorded", d),
                  ("recorded", e)):
    say(what, ptr)
