"""Compressed echoes checked with a second client: the Python `websockets` library (its own
permessage-deflate, which takes uncompressed messages on a compressing connection as RFC 7692
allows). Sends the Autobahn suite's compression test data (the same files and sizes as cases
12.1-12.5) to the node's echo app, whole and fragmented, as text where the file is UTF-8 and as
binary where not, and checks every echo byte for byte.
Usage: python deflate_echo.py WS_URL TESTDATA_DIR    (exits 1 on the first mismatch)"""
import asyncio, os, sys

import websockets

SIZES = [16, 64, 256, 1024, 4096, 8192, 16384, 32768, 65536, 131072]
FILES = ["pg2229.txt", "lena512.bmp", "10.1.1.105.5439.pdf", "data1.json", "data1.html"]
PER_SIZE = 20


async def main(url, testdata):
    checked = 0
    # The node closes a connection past COMBD_WS_RATE; 20 messages a size stay far under it.
    for name in FILES:
        data = open(os.path.join(testdata, name), "rb").read()
        text = name.endswith((".json", ".html"))
        async with websockets.connect(url, compression="deflate", max_size=1 << 22) as ws:
            ext = ws.response.headers.get("sec-websocket-extensions", "")
            if "permessage-deflate" not in ext:
                sys.exit(f"permessage-deflate not negotiated: {ext!r}")
            at = 0
            for size in SIZES:
                for i in range(PER_SIZE):
                    chunk = (data[at:] + data)[:size]
                    at = (at + size) % len(data)
                    msg = chunk.decode("utf-8", "ignore") if text else chunk
                    if i % 2:
                        # Fragmented: in pieces of a quarter of the message.
                        step = max(1, len(msg) // 4)
                        await ws.send([msg[j:j + step] for j in range(0, len(msg), step)])
                    else:
                        await ws.send(msg)
                    echo = await ws.recv()
                    if echo != msg:
                        sys.exit(f"{name}, {size} bytes, message {i}: the echo differs "
                                 f"({len(echo)} against {len(msg)})")
                    checked += 1
    print(f"second client (websockets {websockets.__version__}): {checked} compressed echoes "
          f"of the compression cases' data, whole and fragmented: OK")


asyncio.run(main(sys.argv[1], sys.argv[2]))
