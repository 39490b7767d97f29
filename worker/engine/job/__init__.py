"""One job, the top layer of the engine: preparing it, checking it, planning its steps, running
them (the measures step: measuring.py) and the report (with the unstitched models' rows)."""
