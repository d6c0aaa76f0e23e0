"""The rule codes, generated from the rule classes by `python -m dplint.docs dplint/codes.py` (a
test fails when it is out of date). Settings need only these, so a run answered from the cache
never imports the rules, nor libcst.
"""

# The codes checked in source files, in the engine's order: whether each is on by default.
STATIC_CODES = {
    "DPL001": False,
    "DPL002": True,
    "DPL101": True,
    "DPL102": True,
    "DPL103": True,
    "DPL104": True,
    "DPL201": True,
    "DPL202": True,
    "DPL203": True,
    "DPL301": True,
    "DPL302": True,
    "DPL303": True,
    "DPL304": True,
    "DPL305": True,
    "DPL308": False,
    "DPL401": True,
    "DPL402": True,
    "DPL601": True,
    "DPL501": True,
    "DPL502": True,
    "DPL503": True,
    "DPL504": True,
    "DPL505": True,
    "DPL506": True,
    "DPL507": True,
    "DPL508": True,
    "DPL509": False,
    "DPL510": True,
    "DPL511": True,
    "DPL512": True,
    "DPL513": True,
    "DPL514": True,
    "DPL515": True,
}
# The codes that only the runtime hooks check.
RUNTIME_ONLY_CODES = frozenset({
    "DPL306",
    "DPL307",
    "DPL309",
    "DPL310",
    "DPL520",
    "DPL521",
})
