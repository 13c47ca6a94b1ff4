"""Plans made before a build from measured data: its time, how many shards it needs, the size of its wheels."""
