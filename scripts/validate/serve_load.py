"""Concurrent chat completions against an OpenAI-compatible server on localhost, timed.

Usage: python3 serve_load.py PORT MODEL --requests 16 --prompt-tokens 1500 --max-tokens 96
       [--rounds 1] [--wait 300] [--tag N]
Waits for the server (GET /health) up to --wait seconds, then sends --requests requests at
once per round and prints, per round, the wall time, the completion tokens, any failure and
when each request finished (seconds from the round's start, sorted): a batch that a server
takes in as one wave finishes its requests together, one taken in as several finishes them in
groups. Exit code 1 when any request failed.
"""
import argparse
import concurrent.futures as cf
import json
import sys
import time
import urllib.request

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from hf_models import WORDS, prompt  # noqa: E402


def post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def wait_ready(base, wait):
    deadline = time.time() + wait
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                r.read()
                return True
        except Exception:
            time.sleep(1)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("model")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--wait", type=float, default=300)
    ap.add_argument("--tag", type=int, default=0, help="picks the word that starts every prompt "
                    "of a round: give each call its own, so that no prompt repeats one of another "
                    "call's, whatever the server caches")
    a = ap.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    t0 = time.time()
    if not wait_ready(base, a.wait):
        print(f"serve_load: server not ready after {a.wait} s")
        return 1
    print(f"serve_load: ready after {time.time() - t0:.1f} s")
    failed = 0
    for rnd in range(a.rounds):
        # Each request differs in its first words, so no prefix is shared.
        bodies = [dict(model=a.model, max_tokens=a.max_tokens, temperature=0.0, stream=False,
                       messages=[{"role": "user",
                                  "content": f"w{(a.tag * 1009 + rnd * 31 + 17) % WORDS} w{i} "
                                  + prompt(a.prompt_tokens - 2)}])
                  for i in range(a.requests)]
        t = time.time()

        def timed(body):
            r = post(base + "/v1/chat/completions", body, 600)
            return r, time.time() - t

        with cf.ThreadPoolExecutor(a.requests) as ex:
            futs = [ex.submit(timed, b) for b in bodies]
            toks, errs, ends = 0, [], []
            for f in futs:
                try:
                    r, end = f.result()
                    toks += r.get("usage", {}).get("completion_tokens", 0)
                    ends.append(end)
                except Exception as e:  # a failed request is reported, not fatal
                    errs.append(repr(e)[:300])
        dt = time.time() - t
        failed += len(errs)
        print(f"serve_load: round {rnd} {a.requests} requests in {dt:.3f} s, "
              f"{toks} completion tokens, {len(errs)} failed; finished at "
              + " ".join(f"{x:.2f}" for x in sorted(ends)))
        for e in errs[:3]:
            print("  ", e)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
