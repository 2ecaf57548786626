"""The stand-in's `torch.cuda._gpu_trace`: callback registries as PyTorch's (torch/_utils.py
CallbackRegistry: a `callback_list` each), which the allocator fires."""


class CallbackRegistry:
    def __init__(self, name):
        self.name = name
        self.callback_list = []

    def add_callback(self, cb):
        self.callback_list.append(cb)

    def fire_callbacks(self, *args):
        for cb in self.callback_list:
            cb(*args)


MemoryAllocationCallbacks = CallbackRegistry("CUDA memory allocation")
MemoryDeallocationCallbacks = CallbackRegistry("CUDA memory deallocation")
# The lists themselves, for the stand-in's allocator and the benchmark.
alloc_callbacks = MemoryAllocationCallbacks.callback_list
free_callbacks = MemoryDeallocationCallbacks.callback_list


def register_callback_for_memory_allocation(cb):
    MemoryAllocationCallbacks.add_callback(cb)


def register_callback_for_memory_deallocation(cb):
    MemoryDeallocationCallbacks.add_callback(cb)
