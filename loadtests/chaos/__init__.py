"""A seeded fault-schedule runner with invariant checkers, against a real fleet (issue 32).

N real gateway processes (``authn-gateway serve``'s uvicorn) share one real
redis-server, reached through a TCP proxy that can slow or cut it; a fake IdP with
every fault mode the project has keeps its own record of every call; an
apiserver-like load sends known users, never-seen valid tokens and junk. Faults drawn
from a seed overlap at random; when the run ends the invariants are checked on the
IdP's and the clients' own records. Run ``python -m loadtests.chaos --help``;
loadtests/README.md ("Combined faults") says what each check holds the fleet to.

Modules, in the order a run uses them: :mod:`.settings` (the fleet's config and the
bounds it implies), :mod:`.schedule` (faults from a seed), :mod:`.idp` and
:mod:`.proxy` (the IdP and Redis the faults act on), :mod:`.fleet` (the processes),
:mod:`.faults` (applying a fault), :mod:`.load` (the reviews), :mod:`.invariants`,
:mod:`.run` (one run), :mod:`.shrink` (the shortest failing schedule), :mod:`.plot`.
"""
