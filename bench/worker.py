"""A load-generator worker: ``python -m bench.worker --master-host H [--master-port P] [--token T]``.

Started by ``mme bench --workers K`` (K local processes) or by ``mme bench-worker`` on other
machines. It connects to the master, receives the bench configuration, runs the users the
master assigns and sends every request record back. It exits when the master quits, or
refuses it for a wrong or missing token (``--token``, default ``$MME_BENCH_WORKER_TOKEN``).
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402

from bench.config import TOKEN_ENV  # noqa: E402
from bench.distributed import attach_worker, setup_logging  # noqa: E402
from bench.users import BenchEnvironment, BenchUser  # noqa: E402
from mme.process import die_with_parent  # noqa: E402

DEFAULT_MASTER_PORT = 5557


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--master-host", required=True)
    parser.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT)
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"the master's worker token (default: ${TOKEN_ENV})")
    parser.add_argument("--managed", action="store_true",
                        help="started by a local master: leave Ctrl-C to the master, which stops the run and saves it")
    args = parser.parse_args(argv)
    die_with_parent()  # started by a generator or 'mme bench-worker' that died: leave too
    setup_logging("bench worker")
    if args.managed:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    environment = BenchEnvironment(user_classes=[BenchUser])
    try:
        runner = environment.create_worker_runner(args.master_host, args.master_port)
    except ConnectionError:
        print(f"mme: error: no bench master answered at {args.master_host}:{args.master_port}; start "
              "'mme bench --expect-workers N --master-port P' there first (with --master-bind-host ADDRESS for "
              "workers on other machines)", file=sys.stderr)
        return 2
    attach_worker(environment, runner, token=args.token)
    if not args.managed:
        def leave() -> None:  # tell the master (its 'quit' handling rebalances), then stop
            environment.events.quitting.fire(environment=environment, reverse=True)
            runner.quit()

        gevent.signal_handler(signal.SIGINT, leave)
    try:
        runner.greenlet.join()
    finally:
        environment.generator.close()
        runner.client.close(linger=200)  # zmq would otherwise wait forever on messages the master no longer reads
    if environment.generator.error:
        print(f"mme: error: {environment.generator.error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
