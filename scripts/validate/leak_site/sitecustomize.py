"""A planted leak for the growth analysis (issue 34; docs/validation.md, "Growth over days"):
every chat completion a FastAPI server answers keeps one CUDA tensor of LEAK_BYTES (default
8 MiB) for good, as a middleware that stashed each response's logits on the GPU would. Each
kept tensor is logged to LEAK_LOG as "<CLOCK_MONOTONIC seconds> <bytes>", the planted rate's
ground truth. Put this directory on PYTHONPATH (vramtrace's own sitecustomize runs it)."""
import os
import time

LEAK_BYTES = int(os.environ.get("LEAK_BYTES", 8 << 20))
LEAK_LOG = os.environ.get("LEAK_LOG", "/tmp/leak.log")
_kept = []


def _install():
    try:
        import fastapi
    except Exception:
        return
    original = fastapi.FastAPI.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)

        @self.middleware("http")
        async def keep_logits(request, call_next):
            response = await call_next(request)
            if request.url.path.endswith("/chat/completions"):
                import torch
                _kept.append(torch.empty(LEAK_BYTES // 4, dtype=torch.float32, device="cuda"))
                with open(LEAK_LOG, "a") as f:
                    f.write(f"{time.monotonic():.6f} {LEAK_BYTES}\n")
            return response

    fastapi.FastAPI.__init__ = init


_install()
