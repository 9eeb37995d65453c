"""Pure logic: no asyncio, no I/O, no clocks. Time is always an argument."""
