"""One all_reduce of 1 GiB per rank over NCCL, for the `nccl` step of scripts/validate/h200.sh.

Run under torchrun --nproc-per-node 2. Prints, per rank, its pid, what PyTorch's caching
allocator holds, and the bytes the driver reports in use on its device before and after
(cudaMemGetInfo), then sleeps a few seconds after the collective so nvidia-smi can sample
the processes while NCCL's buffers are still mapped.
"""

import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    free0, total = torch.cuda.mem_get_info()
    dist.init_process_group("nccl")
    x = torch.ones(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    dist.all_reduce(x)
    torch.cuda.synchronize()
    ok = bool((x == dist.get_world_size()).all())
    free1, _ = torch.cuda.mem_get_info()
    print(
        f"rank {rank} pid {os.getpid()} ok {ok} torch_reserved {torch.cuda.memory_reserved()} "
        f"device_used_before_init {total - free0} device_used_after {total - free1}",
        flush=True,
    )
    time.sleep(float(os.environ.get("HOLD_S", "8")))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
