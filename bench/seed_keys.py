"""Creates completed idempotency keys through the API, for the replay workloads.

Each key gets its own amount (1000 + n), so every replay must be answered with its own stored
payment. Writes one line "key amount" per key that was answered 201. Standard library only.
"""

import argparse
import concurrent.futures
import http.client
import json
import sys
import urllib.parse
import uuid


def create(base_url, api_key, items):
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    done = []
    for key, amount in items:
        body = json.dumps(
            {"amount": amount, "currency": "eur", "payment_method": "pm_card_visa"},
            separators=(",", ":"),
        )
        conn.request(
            "POST",
            "/v1/payments",
            body=body,
            headers={
                "Authorization": f"Bearer {api_key}",
                "Content-Type": "application/json",
                "Idempotency-Key": key,
            },
        )
        response = conn.getresponse()
        payload = response.read()
        if response.status != 201:
            raise SystemExit(f"creating key {key}: HTTP {response.status} {payload[:300]!r}")
        done.append((key, amount))
    conn.close()
    return done


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    items = [(str(uuid.uuid4()), 1000 + n) for n in range(args.count)]
    chunks = [items[i :: args.workers] for i in range(args.workers)]
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        results = list(pool.map(lambda chunk: create(args.base_url, args.api_key, chunk), chunks))
    with open(args.out, "w") as out:
        for chunk in results:
            for key, amount in chunk:
                out.write(f"{key} {amount}\n")
    print(f"created {sum(map(len, results))} keys", file=sys.stderr)


if __name__ == "__main__":
    main()
