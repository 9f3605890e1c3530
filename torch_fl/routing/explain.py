def explain(op: str) -> str:
    return op
