//! GetPods, agentk half: list the pods of the cluster through the Kubernetes API.

use async_trait::async_trait;
use bytes::Bytes;
use k8s_openapi::api::core::v1::Pod as KubePod;
use kas_proto::kas::{GetPodsRequest, GetPodsResponse, Pod};
use kube::api::{Api, ListParams};
use prost::Message;
use tonic::Status;

use crate::tunnel::{Responder, TunnelRequest};

/// Pods per list call: large clusters are read in pages, not in one huge response.
const PAGE_SIZE: u32 = 500;

pub struct GetPods {
    kube: kube::Client,
}

impl GetPods {
    pub fn new(kube: kube::Client) -> Self {
        Self { kube }
    }

    async fn list(&self) -> Result<GetPodsResponse, Status> {
        let api: Api<KubePod> = Api::all(self.kube.clone());
        let mut pods = Vec::new();
        let mut params = ListParams::default().limit(PAGE_SIZE);
        loop {
            let page = api.list(&params).await.map_err(|e| super::kube_status(&e))?;
            pods.extend(page.items.into_iter().map(|p| Pod {
                namespace: p.metadata.namespace.unwrap_or_default(),
                name: p.metadata.name.unwrap_or_default(),
            }));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => break,
            }
        }
        Ok(GetPodsResponse { pods })
    }
}

#[async_trait]
impl super::Module for GetPods {
    fn methods(&self) -> &'static [&'static str] {
        &[kas_proto::get_pods::METHOD]
    }

    async fn handle(&self, request: &mut TunnelRequest, responder: &Responder) {
        let result: Result<Bytes, Status> = async {
            // The request carries kas's routing ids only; validate it decodes, then list.
            GetPodsRequest::decode(request.unary_body().await?)
                .map_err(|e| Status::invalid_argument(format!("invalid GetPods request: {e}")))?;
            let response = self.list().await?;
            Ok(Bytes::from(response.encode_to_vec()))
        }
        .await;
        crate::metrics::request(
            "get_pods",
            if result.is_ok() { crate::metrics::Outcome::Ok } else { crate::metrics::Outcome::Error },
        );
        if let Err(status) = &result {
            tracing::warn!(error = %status.message(), "GetPods failed");
        }
        if let Err(e) = responder.unary(result).await {
            tracing::debug!(error = %e.message(), "could not send the GetPods response");
        }
    }
}
