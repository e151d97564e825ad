"""Decisions: which devices, stages, shardings and schedule a model trains with.

    import planner
    plan = planner.plan("gpt3-175b", cluster="128x8xA100-80GB",
                        train=planner.TrainConfig(global_batch=1536, seq_len=2048))
    print(plan.explain())
"""
from planner.plan import Plan, PlanError, SCHEMA
from planner.search import TrainConfig
from planner.api import plan, plan_search
