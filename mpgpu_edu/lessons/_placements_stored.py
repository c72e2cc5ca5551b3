"""Lesson 10's placement study, simulated once: ``planning.placement_rows`` reads these
instead of simulating LLaMA-7B four times (about 40 s) each time the notebook runs.

Keys are ``estimate.placements.placement_key``; values ``simulate_placement``'s numbers.
``tests/test_placements_stored.py`` holds every entry to a fresh simulation. Regenerate
after a change to the simulator, the presets or the placements:
``python -m mpgpu_edu.lessons.planning --placements``.
"""

ROWS: dict[str, dict] = {
    'llama-7b|2x8xH100-ib|2048|tensor|8|1|8|None': {
        'step_s': 0.3732046962444306,
        'tokens_per_s': 87801.68183772956,
        'mfu': 0.2377150106044096,
        'memory': 41991806976,
        'fits': True,
        'capacity': 85899345920,
        'across_bytes': 1684603904,
        'tokens_per_step': 32768,
    },
    'llama-7b|2x8xH100-ib|2048|tensor|8|1|8|0,1,2,3,8,9,10,11,4,5,6,7,12,13,14,15': {
        'step_s': 0.8728684342970714,
        'tokens_per_s': 37540.594564389714,
        'mfu': 0.10163772092045503,
        'memory': 41991806976,
        'fits': True,
        'capacity': 85899345920,
        'across_bytes': 30064771072,
        'tokens_per_step': 32768,
    },
    'llama-7b|2x8xH100-ib|2048|pipeline|1|16|0|None': {
        'step_s': 0.5321299347010203,
        'tokens_per_s': 61578.94503418766,
        'mfu': 0.1667193528122149,
        'memory': 15999438848,
        'fits': True,
        'capacity': 85899345920,
        'across_bytes': 268435456,
        'tokens_per_step': 32768,
    },
    'llama-7b|2x8xH100-ib|2048|zero3|1|1|0|None': {
        'step_s': 0.8239608162397685,
        'tokens_per_s': 39768.88142513888,
        'mfu': 0.10767060347629961,
        'memory': 16169308160,
        'fits': True,
        'capacity': 85899345920,
        'across_bytes': 36429004800,
        'tokens_per_step': 32768,
    },
}
