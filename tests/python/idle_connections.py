"""Opens COUNT TCP connections to HOST:PORT that never send anything, prints "started" once all
connects are under way, and holds them until stdin closes (the test ends or dies).

A child process because one process cannot hold 20,000 sockets next to everything else under a
20,000 file descriptor limit. Sockets close with RST (SO_LINGER 0): no TIME_WAIT left behind.
"""
import socket
import struct
import sys

host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for _ in range(count):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.setblocking(False)
    # EINPROGRESS while kas's accept queue is full: the kernel keeps retrying the SYN.
    s.connect_ex((host, port))
    socks.append(s)
print("started", flush=True)
sys.stdin.read()
