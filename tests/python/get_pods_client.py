#!/usr/bin/env python3
"""A KasApi client that is not ours: calls kas.v1.KasApi/GetPods and ConnectedAgentsById with
stubs generated from proto/proto/kas/v1/kas.proto by grpcio-tools, the way GitLab would.

Usage (stubs generated into STUBS, which must be on PYTHONPATH):
    python3 -m grpc_tools.protoc -I proto/proto --python_out=STUBS --grpc_python_out=STUBS kas/v1/kas.proto kas/tunnel/v1/tunnel.proto kas/kubernetes_api/v1/kubernetes_api.proto kas/gitops/v1/gitops.proto
    PYTHONPATH=STUBS python3 tests/python/get_pods_client.py API_ADDRESS JWT AGENT_ID

Prints one JSON object:
    {"pods": [{"namespace": ..., "name": ...}, ...],
     "connected_agents": [{"id": ..., "connection_id": ..., "pod_name": ..., ...}, ...]}
Exits non-zero (with the gRPC status on stderr) when a call fails.

No retry loop: kas itself holds GetPods until the agent connects (routing.max_wait), so the
call's deadline is the only timing involved.
"""

import argparse
import json
import sys

import grpc

from kas.v1 import kas_pb2, kas_pb2_grpc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("api_address", help="kas api listener, host:port (plaintext)")
    parser.add_argument("jwt", help="GitLab-style JWT (kas mint-jwt)")
    parser.add_argument("agent_id", type=int)
    parser.add_argument("--deadline", type=float, default=30.0, help="seconds per call")
    args = parser.parse_args()

    metadata = (("authorization", f"Bearer {args.jwt}"),)
    with grpc.insecure_channel(args.api_address) as channel:
        api = kas_pb2_grpc.KasApiStub(channel)
        try:
            pods = api.GetPods(
                kas_pb2.GetPodsRequest(agent_id=args.agent_id),
                metadata=metadata,
                timeout=args.deadline,
            )
            connected = api.ConnectedAgentsById(
                kas_pb2.ConnectedAgentsByIdRequest(agent_id=args.agent_id),
                metadata=metadata,
                timeout=args.deadline,
            )
        except grpc.RpcError as e:
            print(f"gRPC call failed: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1

    result = {
        "pods": [{"namespace": p.namespace, "name": p.name} for p in pods.pods],
        "connected_agents": [
            {
                "id": a.id,
                "connection_id": a.connection_id,
                "version": a.version,
                "pod_namespace": a.pod_namespace,
                "pod_name": a.pod_name,
                "project_id": a.project_id,
            }
            for a in connected.agents
        ],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
