alloc_callbacks = []
free_callbacks = []


def register_callback_for_memory_allocation(cb):
    alloc_callbacks.append(cb)


def register_callback_for_memory_deallocation(cb):
    free_callbacks.append(cb)
