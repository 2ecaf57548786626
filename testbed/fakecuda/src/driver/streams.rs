//! Streams and events: validated handles; work completes at once.

use super::*;

impl Driver {
    /// The context a stream belongs to. The null, legacy and per-thread
    /// streams belong to the current context.
    pub(super) fn stream_context(&self, stack: &ContextStack, stream: u64) -> Res<u64> {
        if is_default_stream(stream) {
            return self.current(stack).map(|(context, _)| context);
        }
        let stream = self.streams.get(&stream).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.context(stream.context)?;
        Ok(stream.context)
    }

    /// Validates a stream argument (`cuStreamSynchronize`, `cuStreamQuery`, the `Async` copies).
    pub(crate) fn check_stream(&self, stack: &ContextStack, stream: u64) -> Res<()> {
        self.stream_context(stack, stream).map(drop)
    }

    /// `cuStreamCreate` / `cuStreamCreateWithPriority` in the current context.
    pub(crate) fn stream_create(&mut self, stack: &ContextStack, flags: u32) -> Res<u64> {
        let (context, _) = self.current(stack)?;
        if flags & !abi::CU_STREAM_NON_BLOCKING != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = self.new_handle(HandleKind::Stream);
        self.streams.insert(handle, Stream { context });
        Ok(handle)
    }

    /// `cuStreamDestroy`.
    pub(crate) fn stream_destroy(&mut self, stream: u64) -> Res<()> {
        self.streams
            .remove(&stream)
            .map(drop)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// `cuStreamWaitEvent`.
    pub(crate) fn stream_wait_event(
        &self,
        stack: &ContextStack,
        stream: u64,
        event: u64,
        flags: u32,
    ) -> Res<()> {
        self.check_stream(stack, stream)?;
        self.events.get(&event).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    /// `cuEventCreate` in the current context.
    pub(crate) fn event_create(&mut self, stack: &ContextStack, flags: u32) -> Res<u64> {
        let (context, _) = self.current(stack)?;
        let interprocess_without_disable_timing =
            flags & abi::CU_EVENT_INTERPROCESS != 0 && flags & abi::CU_EVENT_DISABLE_TIMING == 0;
        if flags & !abi::CU_EVENT_ALL != 0 || interprocess_without_disable_timing {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = self.new_handle(HandleKind::Event);
        self.events.insert(
            handle,
            Event {
                context,
                flags,
                recorded: None,
            },
        );
        Ok(handle)
    }

    /// `cuEventRecord`: the stream must belong to the event's context.
    pub(crate) fn event_record(
        &mut self,
        stack: &ContextStack,
        event: u64,
        stream: u64,
    ) -> Res<()> {
        let event_context = self
            .events
            .get(&event)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .context;
        if self.stream_context(stack, stream)? != event_context {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        self.events.get_mut(&event).expect("checked above").recorded = Some(Instant::now());
        Ok(())
    }

    /// `cuEventQuery` / `cuEventSynchronize`: all work is already complete.
    pub(crate) fn check_event(&self, event: u64) -> Res<()> {
        self.events
            .get(&event)
            .map(drop)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// `cuEventDestroy`.
    pub(crate) fn event_destroy(&mut self, event: u64) -> Res<()> {
        self.events
            .remove(&event)
            .map(drop)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// `cuEventElapsedTime`: host time between the two records, in milliseconds.
    pub(crate) fn event_elapsed(&self, start: u64, end: u64) -> Res<f32> {
        let time = |event: u64| -> Res<Instant> {
            let event = self.events.get(&event).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if event.flags & abi::CU_EVENT_DISABLE_TIMING != 0 {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            event.recorded.ok_or(CUDA_ERROR_INVALID_HANDLE)
        };
        let (start, end) = (time(start)?, time(end)?);
        let ms = if end >= start {
            end.duration_since(start).as_secs_f64() * 1e3
        } else {
            -(start.duration_since(end).as_secs_f64() * 1e3)
        };
        Ok(ms as f32)
    }
}
