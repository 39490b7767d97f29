"""One job: preparing it, checking it, planning and tracking its work, running it to a report."""
