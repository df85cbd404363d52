"""Logical calls made with Python's requests and urllib3's Retry, the way a
Python service retries POSTs it sends under an Idempotency-Key.

Usage: requests_client.py BASE_URL CALLS THREADS
Prints one JSON object per call: {"call": ..., "id": ...} or {"call": ..., "err": ...}.
"""
import json
import sys
import threading
import uuid

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


def session():
    s = requests.Session()
    retry = Retry(
        total=8,
        allowed_methods=None,  # POST too: the key makes it safe
        status_forcelist=[409, 503],
        respect_retry_after_header=True,
        backoff_factor=0.2,
        raise_on_status=False,
    )
    s.mount("http://", HTTPAdapter(max_retries=retry))
    return s


def main():
    base, calls, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    lock = threading.Lock()
    counter = iter(range(calls))
    out = []

    def worker():
        s = session()
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            call = "call-%d" % i
            try:
                r = s.post(
                    base + "/v1/customers",
                    data={"description": call},
                    headers={
                        "Idempotency-Key": str(uuid.uuid4()),
                        "Authorization": "Bearer sk_test_python",
                    },
                    timeout=60,
                )
                if r.status_code != 200:
                    res = {"call": call, "err": "%d %s" % (r.status_code, r.text[:200])}
                else:
                    res = {"call": call, "id": r.json().get("id", "")}
            except Exception as e:  # a call that failed for good
                res = {"call": call, "err": repr(e)[:300]}
            with lock:
                out.append(res)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for res in out:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
