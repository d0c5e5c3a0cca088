"""A packet-level model of rxe RC QPs wired to the real switch pipeline and host code.

See docs/rcmodel.md. `World` (rcmodel.world) is the entry point for tests; `rcmodel.rxe`
is the rxe model (its docstring cites the rxe sources it follows), `rcmodel.fabric` the
links, faults and switch, `rcmodel.sim` the simulated clock.
"""
