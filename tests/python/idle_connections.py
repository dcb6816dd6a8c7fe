"""Opens COUNT TCP connections from SOURCE_IP to HOST:PORT that never send anything, prints
"started" once every connect is under way, and holds them until stdin closes.

Connects one at a time while the server keeps up (a burst would overflow the accept queue and leave
connections to slow SYN retries); once a connect does not complete within 3 s (the server
stopped accepting), the rest are only started. A child process because one process
cannot hold 20,000 sockets next to everything else under a 20,000 file descriptor limit. Sockets
close with RST (SO_LINGER 0): no TIME_WAIT left behind. Usage: HOST PORT COUNT SOURCE_IP
"""
import socket
import struct
import sys

IP_BIND_ADDRESS_NO_PORT = 24  # <linux/in.h>; not exported by the socket module

host, port, count, source = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
socks = []
blocking = True
for _ in range(count):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # Each child its own loopback source address: its own 28,000 ephemeral ports. The port is
    # picked at connect (IP_BIND_ADDRESS_NO_PORT): bind() picking it scans the port space each time.
    s.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
    s.bind((source, 0))
    if blocking:
        s.settimeout(3.0)
        try:
            s.connect((host, port))
        except OSError:
            blocking = False
    else:
        s.setblocking(False)
        s.connect_ex((host, port))
    socks.append(s)
print("started", flush=True)
sys.stdin.read()
