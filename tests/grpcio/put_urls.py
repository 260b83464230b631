"""A plain grpcio client of the URL Frontier API, as non-Rust crawlers
(StormCrawler and others) talk to the frontier: it streams discovered URL
items through PutURLs and counts the acks.

usage: put_urls.py ADDRESS PROTO_DIR COUNT CRAWL
Prints "acked N ok M" and exits 0 when every item was acknowledged; exits 1
with the gRPC error otherwise.
"""

import importlib
import sys
import tempfile

import grpc
from grpc_tools import protoc


def stubs(proto_dir, out_dir):
    status = protoc.main(
        [
            "protoc",
            f"-I{proto_dir}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            f"{proto_dir}/urlfrontier.proto",
        ]
    )
    if status != 0:
        sys.exit(f"protoc failed with {status}")
    sys.path.insert(0, out_dir)
    return (
        importlib.import_module("urlfrontier_pb2"),
        importlib.import_module("urlfrontier_pb2_grpc"),
    )


def main():
    address, proto_dir, count, crawl = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    with tempfile.TemporaryDirectory() as out_dir:
        pb, pb_grpc = stubs(proto_dir, out_dir)

        def items():
            for i in range(count):
                info = pb.URLInfo(url=f"http://py{i % 97}.example/page/{i}", crawlID=crawl)
                yield pb.URLItem(discovered=pb.DiscoveredURLItem(info=info), ID=str(i))

        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.URLFrontierStub(channel)
            acked = ok = 0
            try:
                for ack in stub.PutURLs(items()):
                    acked += 1
                    ok += ack.status == pb.AckMessage.OK
            except grpc.RpcError as error:
                print(f"acked {acked} ok {ok}: {error.code()} {error.details()}")
                sys.exit(1)
    print(f"acked {acked} ok {ok}")
    sys.exit(0 if acked == count else 1)


if __name__ == "__main__":
    main()
