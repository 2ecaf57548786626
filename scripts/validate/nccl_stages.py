"""Where a rank's device memory goes under NCCL, stage by stage (the `nccl_stages` step of
scripts/validate/h200.sh, under torchrun --nproc-per-node 2 and `vramtrace run`).

At each stage every rank prints one line `STAGE {json}`: the stage, CLOCK_MONOTONIC ns (the
trace's clock, so the traced live bytes at that moment can be read from `vramtrace events`), its
NVML per-process used memory (nvidia-smi), what PyTorch's allocator reserves, and the driver's
stack-size limit. scripts/validate/nccl_stages_report.py sets them beside the trace.
"""

import ctypes
import json
import os
import subprocess
import time

import torch
import torch.distributed as dist


def nvml_used_mib(pid):
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    ).stdout
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) == pid:
            return int(parts[1])
    return None


def stack_limit():
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_size_t(0)
        # CU_LIMIT_STACK_SIZE = 0x00
        rc = cu.cuCtxGetLimit(ctypes.byref(v), 0)
        return v.value if rc == 0 else None
    except OSError:
        return None


def stage(rank, name):
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    time.sleep(0.5)
    rec = {
        "rank": rank, "pid": os.getpid(), "stage": name,
        "t_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
        "nvml_mib": nvml_used_mib(os.getpid()),
        "torch_reserved": torch.cuda.memory_reserved() if torch.cuda.is_initialized() else 0,
        "stack_limit": stack_limit() if torch.cuda.is_initialized() else None,
        "module_loading": os.environ.get("CUDA_MODULE_LOADING", "(default)"),
    }
    print("STAGE " + json.dumps(rec), flush=True)


def main() -> None:
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    torch.zeros(1, device="cuda")
    stage(rank, "1 context (CUDA initialised, one small kernel)")
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    stage(rank, "2 init_process_group")
    dist.barrier()
    stage(rank, "3 first collective (barrier: communicator set up)")
    x = torch.ones(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    stage(rank, "4 1 GiB tensor allocated")
    dist.all_reduce(x)
    stage(rank, "5 all_reduce of 1 GiB")
    ok = bool((x == dist.get_world_size()).all())
    del x
    torch.cuda.empty_cache()
    stage(rank, f"6 tensor freed, cache emptied (all_reduce ok: {ok})")
    dist.barrier()
    dist.destroy_process_group()
    stage(rank, "7 process group destroyed")


if __name__ == "__main__":
    main()
