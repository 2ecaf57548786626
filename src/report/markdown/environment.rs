//! The environment (driver, devices, processes) and how to read the report.

use super::*;

pub(super) fn environment(out: &mut String, r: &Report) {
    let _ = writeln!(out, "## Environment\n");
    let procs = &r.summary.processes;
    let hosts: Vec<&str> = {
        let mut h: Vec<&str> = r
            .host_names
            .iter()
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .collect();
        h.dedup();
        h
    };
    if !hosts.is_empty() {
        let _ = writeln!(out, "- Host: {}", hosts.join(", "));
    }
    if let Some(s) = &r.started {
        let _ = writeln!(out, "- Recorded: {s}");
    }
    let mut versions: Vec<i32> = procs.iter().filter_map(|p| p.driver_version).collect();
    versions.sort_unstable();
    versions.dedup();
    if versions.is_empty() {
        let _ = writeln!(out, "- Driver: no process reported its driver version");
    } else {
        let _ = writeln!(
            out,
            "- Driver: CUDA {} (what `cuDriverGetVersion` reported); the NVIDIA driver's release number is not in the trace",
            versions
                .iter()
                .map(|v| format!("{}.{} ({v})", v / 1000, (v % 1000) / 10))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut gpus: Vec<(i32, String, Option<u64>, Vec<u32>)> = Vec::new();
    for p in procs {
        // A host allocation (pinned memory) is recorded under ordinal −1: not a GPU.
        for d in p.devices.iter().filter(|d| d.device >= 0) {
            let name = d.name.clone().unwrap_or_else(|| "?".into());
            match gpus
                .iter_mut()
                .find(|g| g.0 == d.device && g.1 == name && g.2 == d.total_bytes)
            {
                Some(g) => g.3.push(p.pid),
                None => gpus.push((d.device, name, d.total_bytes, vec![p.pid])),
            }
        }
    }
    gpus.sort_by_key(|g| g.0);
    if !gpus.is_empty() {
        let _ = writeln!(
            out,
            "\n| GPU | name | total | used by pids |\n| --- | --- | ---: | --- |"
        );
        for (o, n, t, pids) in &gpus {
            let _ = writeln!(
                out,
                "| cuda:{o} | {} | {} | {} |",
                cell(n),
                t.map(both).unwrap_or_else(|| "?".into()),
                pids.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let _ = writeln!(
            out,
            "\nOrdinals are as each process saw them (after `CUDA_VISIBLE_DEVICES`); processes that list the same ordinal are taken to share the device."
        );
    }
    if !procs.is_empty() {
        let _ = writeln!(
            out,
            "\n| pid | parent | rank / worker | program | trace file |\n| ---: | ---: | --- | --- | --- |"
        );
        for p in procs {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                p.pid,
                p.ppid,
                rank_of(&p.command).unwrap_or_default(),
                code(&cell(&program(p))),
                code(&cell(
                    std::path::Path::new(&p.file)
                        .file_name()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default()
                        .as_str()
                ))
            );
        }
        let _ = writeln!(out, "\nCommand lines:\n\n```text");
        for p in procs {
            let _ = writeln!(out, "{}: {}", p.pid, p.command.join(" "));
        }
        let _ = writeln!(out, "```\n");
    }
    let problems: Vec<(u32, &String)> = procs
        .iter()
        .flat_map(|p| p.problems.iter().map(move |x| (p.pid, x)))
        .collect();
    if !problems.is_empty() {
        let _ = writeln!(out, "Trace problems (the rest of each file was read):\n");
        for (pid, x) in problems {
            let _ = writeln!(out, "- pid {pid}: {x}");
        }
        let _ = writeln!(out);
    }
    tensor_capture_lines(out, procs);
}

/// Per process: whether PyTorch's tensors were recorded, the recorder's notes, and the time
/// ranges whose tensor detail the size budget dropped.
fn tensor_capture_lines(out: &mut String, procs: &[crate::summary::ProcessSummary]) {
    let mut lines = Vec::new();
    for p in procs {
        if let Some(c) = &p.tensor_capture {
            lines.push(format!("- pid {}: tensors {}", p.pid, c.status));
        }
        for l in &p.tensor_detail_lost {
            lines.push(format!(
                "- pid {}: tensor detail lost to the size budget from {} to {} ({} blocks dropped; driver events, failures and the live set kept)",
                p.pid,
                fmt_secs(l.from_s),
                fmt_secs(l.to_s),
                l.blocks
            ));
        }
        for n in &p.notes {
            lines.push(format!("- pid {}: note: {}", p.pid, n));
        }
    }
    if !lines.is_empty() {
        let _ = writeln!(out, "Tensor capture and the recorder's notes:\n");
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
        let _ = writeln!(out);
    }
}

pub(super) fn how_to_read(out: &mut String, r: &Report) {
    let _ = writeln!(
        out,
        "## How to read this report\n\n- Bytes are what the CUDA driver was asked for (`cuMemAlloc*`, `cuMemCreate`, ...), recorded by vramtrace's preload; PyTorch's caching allocator asks for segments, so one allocation may hold many tensors.\n- The verdict, the category table with its evidence (\"Every byte in a category\") and `report --json`'s `categories` come from the categoriser (Python frames of the loaders and caches, native modules, labels, lifetimes; docs/architecture.md); the verdict's classes are the kernel's live set, KV-cache growth, fragmentation, CUDA graphs, another process, context and modules, and an enforced limit. The shortfall is against the limit that was enforced: PyTorch's per-process limit when its allocator refused, else `--capacity`, else the card.\n- Categories, as in `vramtrace live` and `summary`, come from one categoriser: the frames of the code that allocated (the loaders and cache constructors of transformers, vLLM and SGLang, Triton's autotuner, NCCL, cuBLAS, llama.cpp), then labels and names (`weight` → weights, `kv` or `cache` → KV cache, `_state` → recurrent state, `ballast` or `capacity` → other processes), then the lifetime read from the Python frames (made before the first step → weights, kept by every step → KV cache, replaced each step → recurrent state); what no rule covers is unnamed, by its Python line. The allocator's reserve is its segments minus their live tensors; context is the driver's total − free − what was traced. Each row says what it rests on. Groups collapse the numbers that index layers and chunks to `#`.\n- Untraced = device total − the driver's free − the live bytes of every traced process on that device: CUDA contexts, loaded modules, and processes that were not traced.\n- Generated by `vramtrace report`."
    );
    if r.unsymbolised {
        let _ = writeln!(
            out,
            "- Some frames are addresses only: the files the traced processes loaded are not on the machine this report was made on (or their build ids differ). Run `vramtrace report` where the program ran to name them."
        );
    }
}
