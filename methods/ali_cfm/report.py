"""ALI-CFM's tables and figures from a results record."""


def plot(record: dict, workdir: str) -> list[str]:
    del record, workdir
    return []
